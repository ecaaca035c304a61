"""moetune: an automatic performance tuner for Mixture-of-Experts training with Megatron on Slurm.

Layers in the order the data flows, each importing only those before it:

    errors, paths, the base: one error base; where moetune's own files are; every environment
    settings       variable moetune reads, each read when asked
    experiment     what a run is: the model, the training config (-> Megatron argv), the experiment
                   YAML and its validated Cluster, GPUs, constraints, fit configs, preflight checks
    store          studies, trials, stage runs, metrics, decisions (SQLAlchemy)
    estimate       the memory estimate and the step-time model, and the store's readings they use
    job            job scripts from the templates, a trial folder's file names, the scheduler
                   (submitit: Slurm or local), post-processing, the demo's replay
    trial          a trial's stages, files in -> files out, recorded in the store; one run of a trial
    decide         the rule table, did the fix take effect, is it faster (the judge)
    tune           study state, the loop, its summary, one tuner per study
    report         study reports (Markdown, HTML) and `moetune status`
    cli            `moetune`

Apart from the layers: moetune.analysis (trace and log analysis: imports nothing of moetune but
itself) and moetune.workloads (the programs that run inside the job by their path: they may read
the analysis, nothing else). tests/base/test_layers.py keeps it so.
"""

__version__ = "0.1.0"
