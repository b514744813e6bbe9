#include "backend/CompletedWork.hpp"

#include <ATen/core/ivalue.h>

namespace cuda_p2p {

namespace {

std::vector<c10::Device> devices_of(const std::vector<at::Tensor>& tensors) {
  std::vector<c10::Device> devices;
  for (const auto& t : tensors) {
    if (t.defined() && !t.is_cpu() &&
        std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
  }
  return devices;
}

}  // namespace

CompletedWork::CompletedWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type), outputs_(std::move(outputs)) {
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                     devices_of(outputs_));
  future_->markCompleted(c10::IValue(outputs_));
  finish();
}

}  // namespace cuda_p2p
