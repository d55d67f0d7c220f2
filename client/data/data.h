/* Layer client/data: file formats of host tensors: safetensors checkpoints and IDX datasets.
 * Calls only client/tensor and client/conn (host tensors and the client's last error) and the
 * runtime's safetensors format (wire/safetensors.h), beside client/move and never through it. */
#ifndef TT_CLIENT_DATA_H
#define TT_CLIENT_DATA_H

#include "tensor/tensor.h"

/* tt_safetensors_save with a "__metadata__" object: n_metadata string pairs, metadata[2i]
 * the key and metadata[2i + 1] its value (as Python's save_file(..., metadata=)). */
tt_status tt_safetensors_save_metadata(tt_client *client, const char *path, const char *const *names,
                                       tt_tensor *const *tensors, int n, const char *const *metadata, int n_metadata);

/* The value of key in the file's "__metadata__" (lent until tt_safetensors_close); NULL
 * when there is none. */
const char *tt_safetensors_metadata(const tt_safetensors *file, const char *key);

#endif
