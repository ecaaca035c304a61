"""moetune's pipeline: layers in the order the data flows, each importing only those before it.

    errors, paths, one error base; where moetune's own files are; the environment variables it
    settings       reads, each read when asked
    spec           model, training config (-> Megatron args), experiment YAML, GPUs, constraints, memory
    job            job scripts from the templates, the scheduler (submitit: Slurm or local), and the
                   workloads that run inside the job
    store          studies, trials, stage runs, metrics, decisions (SQLAlchemy)
    trial          a trial's stages, files in -> files out, recorded in the store; one run of a trial
    decide         the rule table, did the fix take effect, is it faster (the judge)
    tune           study state, the loop, its summary, one tuner per study
    report         study reports (Markdown, HTML) and `moetune status`
    cli            `moetune`

moetune.analysis (trace and log analysis) sits below all of them and imports none.
tests/test_layers.py keeps it so.
"""
