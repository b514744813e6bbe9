// torch.ops.cuda_p2p.all_reduce_ and all_reduce (backend/dispatcher_all_reduce.cpp).
#pragma once

namespace cuda_p2p {

// Referenced by the Python extension so that the linker keeps the op's registration, which
// lives in a static library.
void ensure_all_reduce_op_registered();

}  // namespace cuda_p2p
