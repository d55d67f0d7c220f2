"""ttd: Python access to a ttd daemon through libttclient.

`import ttd.torch as ttd` gives PyTorch's flow: tensors moved with .to("tt"), modules compiled
with ttd.compile, the loss and its backward on the CPU reaching the card, ttd.optim.SGD."""
