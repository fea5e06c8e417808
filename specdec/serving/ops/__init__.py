"""The instructor's operations: launch configurations (launch), GPU memory plans (gpu), starting and
stopping servers (lifecycle), ports (ports), a classroom of servers (room) and the checks before a class
(preflight). Used by `specdec launch`, `specdec room` and `specdec preflight`; it imports the measuring
side and the decoder's method table, and starts a server only as a process, never by import."""
