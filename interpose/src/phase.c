/* phase.c -- the minibatch phase functions, as no-ops.
 *
 * A native program marks its optimizer step with jitckpt_phase_optimizer_begin()
 * and jitckpt_phase_optimizer_end(), found with dlsym(RTLD_DEFAULT, ...) so that
 * it runs without jitckpt too (interpose/include/jitckpt_remote_calllog.h).
 * Transparent mode's remote library uses them to bound its call log; the
 * passthrough library has no call log and exports them only so that a program
 * finds the same names under either library. */

#include "interpose.h"

EXPORT void jitckpt_phase_optimizer_begin(void) {}
EXPORT void jitckpt_phase_optimizer_end(void) {}
