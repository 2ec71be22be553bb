/* Input of regenerate-bindings.sh: rdma-core's public libibverbs headers (Debian libibverbs-dev) and the
 * kernel's uverbs ABI structures that rdma-core's marshall.h copies from (Debian linux-libc-dev). */
#include <infiniband/verbs.h>
#include <infiniband/sa.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/ib_user_sa.h>
