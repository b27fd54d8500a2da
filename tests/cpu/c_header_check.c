/* Compiled as C: coda.h and block.h must be valid C headers (the ABI that ctypes and other languages bind to). */
#include <coda/block.h>
#include <coda/coda.h>

int coda_c_header_check(void) {
  coda_tensor t = {0};
  coda_ce_options o = coda_ce_options_default();
  t.dtype = CODA_BF16;
  t.rank = 0;
  return (int)coda_dtype_size(t.dtype) + (int)o.reduction;
}

/* The block structs' initialisers (block.h "Versioning"): 1 when each sets struct_size to its struct's size and
 * leaves the other fields zero. */
int coda_c_block_init_check(void) {
  coda_block_config c = CODA_BLOCK_CONFIG_INIT;
  coda_block_weights w = CODA_BLOCK_WEIGHTS_INIT;
  coda_block_grads g = CODA_BLOCK_GRADS_INIT;
  coda_block_saved s = CODA_BLOCK_SAVED_INIT;
  return c.struct_size == sizeof c && w.struct_size == sizeof w && g.struct_size == sizeof g &&
         s.struct_size == sizeof s && c.hidden_size == 0 && w.w_qkv.data == 0 && s.qkv.rank == 0;
}
