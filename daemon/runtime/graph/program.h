/* Layer runtime/graph: the op catalogue (names, arity, shape inference) and the program
 * compiler, over tensor specs. Calls runtime/base and kernels/.
 *
 * A compiled program: a validated graph in topological order with every value's dtype
 * and shape inferred. Immutable once built, reference counted, shared by every session
 * that compiled the same graph (see program_cache.h). */
#ifndef TTD_PROGRAM_H
#define TTD_PROGRAM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "graph/ops.h"

#define TTD_MAX_GRAPH_NODES 100000
#define TTD_MAX_NODE_INPUTS 3

typedef enum ttd_value_kind { TTD_VALUE_INPUT, TTD_VALUE_PARAM, TTD_VALUE_NODE } ttd_value_kind;

typedef struct ttd_program_value {
  char *name;
  ttd_value_kind kind;
  ttd_value_type type;
  bool requires_grad; /* float and reached from a parameter or a float input */
  bool param_grad;    /* float and reached from a parameter: a Backward that returns no input
                       * gradients computes only these (a batch's dx is never wanted) */
} ttd_program_value;

typedef struct ttd_program_node {
  ttd_op op;
  int n_inputs;
  int inputs[TTD_MAX_NODE_INPUTS]; /* value indices */
  int value;                       /* the value it produces */
  ttd_op_attrs attrs;
  /* A linear whose value only the next node, a relu, reads, neither value an output of the
   * program: a backend that fuses_relu computes the relu in the linear's epilogue, and the
   * relu node passes that value on (program_run.c). */
  bool relu_next;
  /* A relu whose value only the next node, a linear, reads, as its x, the value no output: a
   * backend that masks_relu_grad has that linear's backward apply this relu's backward to
   * the gradient of x as it writes it, and the relu's backward passes it on. */
  bool grad_next;
} ttd_program_node;

typedef struct ttd_program {
  atomic_int refs;
  unsigned char *key; /* the packed graph: the cache key */
  size_t key_len;
  uint64_t hash;
  int n_inputs, n_params, n_nodes, n_outputs, n_values;
  ttd_program_value *values; /* inputs, then parameters, then one per node in order */
  ttd_program_node *nodes;   /* topological order */
  int *outputs;              /* value indices */
  uint64_t host_bytes;       /* the daemon's memory it takes: values, names, nodes, its key */
  double cost;               /* ttd_op_cost summed over the nodes: one forward's operations */
  int costliest;             /* the node (in order) of the largest ttd_op_cost, -1 without nodes */
  double costliest_cost;
} ttd_program;

/* Validates graph and builds a program with one reference. INVALID_ARGUMENT names the
 * node (or value) and the reason: a cycle, a dangling or duplicate name, an unknown op,
 * a wrong arity, a shape or dtype mismatch. */
ttd_status_t ttd_program_compile(const Ttd__V1__Graph *graph, ttd_program **out_program);

ttd_program *ttd_program_retain(ttd_program *program);
void ttd_program_release(ttd_program *program); /* accepts NULL */

/* The index of input i / parameter i / node i's value. */
static inline int ttd_program_param_value(const ttd_program *p, int i) { return p->n_inputs + i; }

#endif
