"""The measuring side: a client of any SGLang-compatible server (client), what its answers mean (records),
closed-loop sweeps (bench), plain against speculative (compare), the prompts (prompts) and the machine a
timing was taken on (machine). Used by the Lab 3 notebooks, `specdec bench`, the grader and the zoo; it
imports only the simulation's formulas (numpy), never torch, the server or the operations."""
