/* The kernels of cpu_kernels.c that cpu_step.c's one-call training step calls (each is
 * documented where it is defined). */
#ifndef G4R_CPU_KERNELS_H
#define G4R_CPU_KERNELS_H
#include <stddef.h>
#include <stdint.h>

/* One field of a structure that Python fills through a ctypes mirror (rule_t here, step_t of
 * cpu_step.c): its name, offset and size. Each structure exports a table of them, which the
 * loader (gru4rec/kernels/cpu.py, check_layout) compares with the mirror's when the library
 * loads: a field added, moved or resized on one side only is an error there, not a stray write. */
typedef struct {
    const char *name;
    int64_t offset, size;
} g4r_field_t;
#define G4R_FIELD(type, field) {#field, (int64_t)offsetof(type, field), (int64_t)sizeof(((type *)0)->field)}
#define G4R_N_FIELDS(table) ((int64_t)(sizeof(table) / sizeof((table)[0])))

/* an optimiser's update of one table (cpu_kernels.c; the Python side fills it) */
typedef struct rule rule_t;
void g4r_update_tables(int64_t n_tables, const rule_t *const *rules, const int64_t *n_rows, const int64_t *const *rows,
                       float *const *g);

int64_t g4r_unique(int64_t n, const int64_t *rows, int64_t n_first, int64_t n_items, uint8_t *mark,
                   int64_t *slot, int64_t *uniq, int64_t *inverse, int64_t *n_uniq_first);
void g4r_column_bias(int64_t C, int64_t n_in, const int64_t *cols, const float *by, const float *logq_in,
                     const float *logq_sample, const float *valid, float *out);
void g4r_gather_columns(int64_t n_rows, int64_t n_src, int64_t n_cols, const float *s,
                        const int64_t *group, const float *bias, float *out);
void g4r_sum_columns(int64_t n_rows, int64_t n_cols, int64_t n_out, const float *g,
                     const int64_t *group, float *out);
void g4r_sum_rows(int64_t n_rows, int64_t n_cols, const float *g, float *out);
void g4r_add_rows(int64_t n, const int64_t *rows, int64_t width, const float *src, float *table);
void g4r_cross_entropy(int64_t B, int64_t C, float *x, const float *w, int64_t logit_form, float *loss);
void g4r_bpr_max(int64_t B, int64_t C, float *r, const float *valid, const float *w,
                 float bpreg, int64_t has_elu, float elu_alpha, float *grad, float *loss);
void g4r_gru_gates(int64_t B, int64_t n, float *a, const float *h, float *hr);
void g4r_gru_output(int64_t B, int64_t n, float *u, const float *h, const float *rz,
                    const float *mask, float *out);
void g4r_gru_backward_out(int64_t B, int64_t n, const float *d, const float *mask, const float *rz,
                          const float *c, const float *h, float *dv);
void g4r_gru_backward_reset(int64_t B, int64_t n, const float *t, const float *h, const float *rz,
                            float *dv, float *g_bias);

#endif
