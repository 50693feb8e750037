"""What runs on a rank around any program, yours or the built-in trainer: the shim, torchrun's
agent, the output stamper and what a rank leaves running, a Python function as a program, each
node's standby, the hang dumps, and the launcher's environment read into ``DistEnv``."""
