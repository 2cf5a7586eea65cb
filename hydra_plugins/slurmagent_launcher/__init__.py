"""Hydra finds slurmagent's launcher and search path here (hydra_plugins is a namespace
package with no __init__.py). The real code lives in the slurmagent package."""
