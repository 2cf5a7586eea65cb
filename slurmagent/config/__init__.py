"""Typed job specs and settings: the *Conf dataclasses and their strict parsing from Hydra configs.

The YAML in conf/ stays plain (so users can compose freely); at the launcher boundary each
group is parsed into its dataclass by `parse_conf`, which refuses unknown keys (listing the
valid ones), wrong types and out-of-range values with a message naming the key.

One module per kind of setting; import from here (`from slurmagent.config import JobSpec`):
  spec.py          what one task asks for: resources, checkpoint, recovery, task, health, env; JobSpec
  code.py          whether a sweep runs a snapshot of the project's files
  site.py          the site's facts (GPU catalogue, priorities, scheduling knobs) and the budget
  launcher.py      the Hydra launcher's and sweepers' own options
  hpo.py           the adaptive search's settings
  adapt.py         the in-loop controller's settings
  track.py         the trackers a task's metrics also go to (TensorBoard, MLflow, W&B)
  notify.py        who is told what happens to a sweep (a webhook, e-mail)
  parse.py         parse_conf: a group into its dataclass, strictly
  registration.py  Hydra's structured configs; Hydra's errors as one-line ConfigErrors
"""

from slurmagent.config.adapt import ADAPT_MODES, AdaptConf, ExplosionConf, PlateauConf, adapt_conf
from slurmagent.config.code import SNAPSHOT_CHOICES, CodeConf, code_conf
from slurmagent.config.hpo import HPO_DIRECTIONS, HPO_STOP_AT, HPO_TRIAL, HpoBudget, HpoConf, HpoFidelity, hpo_conf
from slurmagent.config.launcher import (
    ON_REFUSAL_CHOICES,
    SUPERVISOR_CHOICES,
    HpoSweeperConf,
    LauncherConf,
    SweeperConf,
    validate_launcher,
)
from slurmagent.config.notify import NotifyConf, notify_conf
from slurmagent.config.parse import parse_conf, unknown_key
from slurmagent.config.registration import SPEC_NODE, config_error, register_configs
from slurmagent.config.site import (
    PRIORITIES,
    BudgetConf,
    GpuConf,
    PriorityConf,
    SchedulingConf,
    SiteConf,
    budget_conf,
    default_site,
    site_conf,
)
from slurmagent.config.spec import (
    AUTO,
    CLUSTER_CHOICES,
    SIGNAL_CHOICES,
    SPEC_GROUPS,
    CheckpointConf,
    ClusterChoice,
    ContainerConf,
    EnvConf,
    HealthConf,
    JobSpec,
    RecoveryConf,
    ResourcesConf,
    TaskConf,
    auto_keys,
    checkpoint_conf,
    job_spec,
    resolve_target,
    spec_dict,
    spec_key,
    validate_checkpoint,
    validate_health,
    validate_recovery,
    validate_resources,
    validate_task,
)
from slurmagent.config.track import MlflowConf, TrackConf, WandbConf, track_conf

__all__ = [
    "ADAPT_MODES",
    "AUTO",
    "CLUSTER_CHOICES",
    "HPO_DIRECTIONS",
    "HPO_STOP_AT",
    "HPO_TRIAL",
    "ON_REFUSAL_CHOICES",
    "PRIORITIES",
    "SIGNAL_CHOICES",
    "SNAPSHOT_CHOICES",
    "SPEC_GROUPS",
    "SPEC_NODE",
    "SUPERVISOR_CHOICES",
    "AdaptConf",
    "BudgetConf",
    "CheckpointConf",
    "ClusterChoice",
    "CodeConf",
    "ContainerConf",
    "EnvConf",
    "ExplosionConf",
    "GpuConf",
    "HealthConf",
    "HpoBudget",
    "HpoConf",
    "HpoFidelity",
    "HpoSweeperConf",
    "JobSpec",
    "LauncherConf",
    "MlflowConf",
    "NotifyConf",
    "PlateauConf",
    "PriorityConf",
    "RecoveryConf",
    "ResourcesConf",
    "SchedulingConf",
    "SiteConf",
    "SweeperConf",
    "TaskConf",
    "TrackConf",
    "WandbConf",
    "adapt_conf",
    "auto_keys",
    "budget_conf",
    "checkpoint_conf",
    "code_conf",
    "config_error",
    "default_site",
    "hpo_conf",
    "job_spec",
    "notify_conf",
    "parse_conf",
    "register_configs",
    "resolve_target",
    "site_conf",
    "spec_dict",
    "spec_key",
    "track_conf",
    "unknown_key",
    "validate_checkpoint",
    "validate_health",
    "validate_launcher",
    "validate_recovery",
    "validate_resources",
    "validate_task",
]
