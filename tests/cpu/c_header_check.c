/* Compiled as C: coda.h must be a valid C header (the ABI that ctypes and other languages bind to). */
#include <coda/coda.h>

int coda_c_header_check(void) {
  coda_tensor t = {0};
  coda_ce_options o = coda_ce_options_default();
  t.dtype = CODA_BF16;
  t.rank = 0;
  return (int)coda_dtype_size(t.dtype) + (int)o.reduction;
}
