"""Lets users' own Hydra apps compose slurmagent's configs (pkg://slurmagent.conf)."""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class SlurmAgentSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="slurmagent", path="pkg://slurmagent.conf")
