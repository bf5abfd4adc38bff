"""vLLM serving, torch-free at import: ``armorlab vllm-serve``, the servers a Slurm job starts beside
its trainer and their checks, the endpoints file that tells the trainer where they listen, and the
environment an engine needs."""
