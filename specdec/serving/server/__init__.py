"""The server: `specdec serve`, an SGLang-compatible HTTP front (app) over the Lab 2 engine (scheduler,
protocol). Used by the `specdec serve` command; it imports the decoder and the simulation only, never the
measuring side or the instructor's operations (they talk to it over HTTP, or start it as a process)."""
