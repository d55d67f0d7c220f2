/* Builds ttd.v1.Graph messages in tests: fixed storage, no allocation. */
#ifndef TTD_TESTS_GRAPH_BUILDER_H
#define TTD_TESTS_GRAPH_BUILDER_H

#include "ttd/v1/ttd.pb-c.h"

#define MAXV 40

/* A graph under construction with owned storage. */
typedef struct graph_builder {
  Ttd__V1__Graph graph;
  Ttd__V1__ValueSpec specs[MAXV], *inputs[MAXV], *params[MAXV];
  int64_t dims[MAXV][4];
  Ttd__V1__Node nodes[MAXV], *node_ptrs[MAXV];
  char *node_inputs[MAXV][3];
  Ttd__V1__Attr attrs[MAXV][2], *attr_ptrs[MAXV][2];
  Ttd__V1__IntList lists[MAXV];
  int64_t list_values[MAXV][4];
  char *outputs[4];
  int n_specs;
} graph_builder;

void gb_init(graph_builder *b);

/* Adds a graph input (param 0) or parameter (param 1) with up to 4 dims. */
void gb_value(graph_builder *b, int param, const char *name, int dtype, int ndim, int64_t d0, int64_t d1, int64_t d2,
              int64_t d3);

/* Adds a node with up to 3 inputs (NULL ends the list). */
Ttd__V1__Node *gb_node(graph_builder *b, const char *name, const char *op, const char *in0, const char *in1,
                       const char *in2);

/* Adds an integer attribute to a node (at most 2 attributes a node). */
void gb_int(graph_builder *b, Ttd__V1__Node *n, const char *name, int64_t v);

/* Adds a float attribute to a node. */
void gb_float(graph_builder *b, Ttd__V1__Node *n, const char *name, float v);

void gb_output(graph_builder *b, const char *name);

/* Compiles the graph in session (raw calls) and asserts the code and (if needle) a part
 * of the message; returns the response (free_unpacked) when the code is OK, else NULL. */
Ttd__V1__CompileResponse *gb_compile(graph_builder *b, const char *target, const char *session, int want_code,
                                     const char *needle);

/* Compiles y = relu(x) for a float32 input x of ndim (1 or 2) dims d0 x d1 in session;
 * asserts OK and returns the program handle. */
uint64_t gb_compile_relu(const char *target, const char *session, int ndim, int64_t d0, int64_t d1);

#endif
