"""Search: Optuna studies whose trials are runs (``armorlab tune``).

Torch-free; a trial meets training only through its run directories, like a sweep's jobs. It may
use analysis' pure metrics (collapse step, summaries); analysis never imports this package.
Importing it is cheap: only backend, pruners and worker import optuna.

    study              the study dir: spec → study, local / Slurm workers, status, plots, report sections
    space              the spec's ``search:`` section → validated SearchSpec → trial configs (optuna-free)
    backend            Optuna storage (journal / RDB), sampler, study, trial ownership and reconciliation
    pruners            median, hyperband and the collapse pruner
    worker             one worker: ask → train the trial's runs → report → tell
    synthetic_trainer  a stand-in trainer with closed-form curves and a known optimum, for tests
"""
