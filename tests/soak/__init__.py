"""The soak drill (marker `soak`): `ctxapp up` run as the README prints it, under a steady mixed
load for minutes, clean and with its engines restarted or killed in the middle (docs/reliability.md,
"Soak drill")."""
