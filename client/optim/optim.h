/* Layer client/optim: what a training loop uses on top of modules: optimizers (on the card,
 * queued on the module, or on the host) and the progress line. Calls only client/module and
 * the layers below it. */
#ifndef TT_CLIENT_OPTIM_H
#define TT_CLIENT_OPTIM_H

#include "module/module.h"

#endif
