/* Layer client/data: file formats of host tensors: safetensors checkpoints and IDX datasets.
 * Calls only client/tensor and client/conn (host tensors and the client's last error),
 * beside client/move and never through it. */
#ifndef TT_CLIENT_DATA_H
#define TT_CLIENT_DATA_H

#include "tensor/tensor.h"

#endif
