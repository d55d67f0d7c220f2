/* What the training suites share: the MLP they train and reading a parameter's .grad. */
#ifndef TTD_TESTS_TRAINING_FIXTURE_H
#define TTD_TESTS_TRAINING_FIXTURE_H

#include <stddef.h>

#include "ttclient.h"

/* The MLP's sizes: a batch of TF_N rows of TF_IN, TF_H hidden units, TF_OUT outputs. */
enum { TF_N = 8, TF_IN = 12, TF_H = 16, TF_OUT = 3 };

/* x [TF_N, TF_IN] -> linear TF_H, relu, linear TF_OUT (seed 42), its parameters "linear1.weight",
 * "linear1.bias", "linear2.weight" and "linear2.bias". */
tt_graph *tf_mlp(tt_client *client);

/* The n floats of m's parameter `name`'s .grad, downloaded into out (sends queued work first). */
void tf_grad_of(tt_client *client, tt_module *m, const char *name, float *out, size_t n);

#endif
