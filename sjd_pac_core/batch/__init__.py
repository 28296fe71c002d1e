"""`sjd-pac batch`: many images, resumable, in this process or on Ray workers.

    jobs.py        INPUT (text or JSONL) x seeds x methods -> Jobs with stable ids (no torch)
    store.py       the output folder: PNGs and results.jsonl written atomically, read back on resume
    work.py        run_job(model, job): the one job function every runner calls
    runners.py     the in-process runner
    ray_runner.py  the Ray runner (extra `sjd-pac[ray]`): one actor per worker, same job function
    resources.py   --workers / --threads against the cores and GPUs there are; does a Ray address answer
    driver.py      run_batch: lock, read, check, load (unless all is done), plan, run, write, summarise
    summary.py     summary.md: the benchmark's table over the batch, AR-token agreement
    cli.py         the `sjd-pac batch` subcommand (arguments checked before torch is imported)
"""
