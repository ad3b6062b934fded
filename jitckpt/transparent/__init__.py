"""The Python side of transparent mode (``jit-run --transparent``; issue 12).

In transparent mode the worker runs the user's program unchanged with
``libjitckpt_remote.so`` preloaded, and a device proxy per rank holds the GPU
state (``proxy_server/README.md``).  Most of it is C; two parts are Python:

- ``rendezvous``: ``python -m jitckpt.transparent.rendezvous --generation G``,
  run by the remote library during a recovery: every rank hands in a token
  and gets back every rank's, through torchrun's store;
- ``phases``: minibatch boundaries of a Python program, from PyTorch's
  optimizer step hooks, told to the remote library
  (``jitckpt_phase_optimizer_begin``/``_end``); installed by jit-run's worker
  bootstrap when ``JITCKPT_TRANSPARENT=1``.

``jit-run --transparent`` itself is ``jitckpt.launch.transparent``; the
environment variables are named in ``jitckpt.config``.  Nothing here has
effects on import, and this ``__init__`` imports nothing, so that
``python -m jitckpt.transparent.rendezvous`` starts as fast as it can.
"""
