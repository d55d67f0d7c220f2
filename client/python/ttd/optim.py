"""torch.optim's optimizers, stepping on the card over a compiled module's parameters."""
from . import _lib
from .module import Parameter


class SGD:
    """torch.optim.SGD's signature; steps on the card (tt_sgd_opts) over a compiled module's
    parameters, all of them."""

    def __init__(self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False):
        params = list(params)
        owners = {id(p._owner): p._owner for p in params if isinstance(p, Parameter)}
        if len(owners) != 1 or len(params) != len(next(iter(owners.values()))._params):
            raise NotImplementedError("ttd.optim.SGD takes all the parameters of one compiled module "
                                      "(tt_model.parameters())")
        self._owner = next(iter(owners.values()))
        self.defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                             nesterov=nesterov)
        self._opt = None

    def _get(self):
        if self._opt is None:
            d = self.defaults
            self._opt = _lib.Optimizer.sgd(self._owner._built(), d["lr"], d["momentum"], d["dampening"],
                                           d["weight_decay"], d["nesterov"])
        return self._opt

    def step(self):
        self._get().step()

    def zero_grad(self, set_to_none=False):
        if self._owner._module is not None:
            self._get().zero_grad()
