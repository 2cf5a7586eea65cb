# sbatch script templates (Jinja2) rendered by `slurmagent render`; a package so that
# importlib.resources finds them inside the installed wheel.
