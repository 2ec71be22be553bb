/* Input of regenerate-bindings.sh: rdma-core's public libibverbs header (Debian libibverbs-dev). */
#include <infiniband/verbs.h>
