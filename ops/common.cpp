#include "ops/common.hpp"

#include <c10/util/Exception.h>

#include <cctype>

namespace cuda_p2p::ops {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "SUM";
    case ReduceOp::kAvg:
      return "AVG";
    case ReduceOp::kProduct:
      return "PRODUCT";
    case ReduceOp::kMin:
      return "MIN";
    case ReduceOp::kMax:
      return "MAX";
    case ReduceOp::kBand:
      return "BAND";
    case ReduceOp::kBor:
      return "BOR";
    case ReduceOp::kBxor:
      return "BXOR";
  }
  return "?";
}

std::string lower_name(ReduceOp op) {
  std::string name = to_string(op);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

ReduceOp parse_reduce_op(const std::string& name, std::initializer_list<ReduceOp> allowed,
                         const char* what) {
  std::string names;
  for (ReduceOp op : allowed) {
    if (name == lower_name(op)) return op;
    names += (names.empty() ? "\"" : ", \"") + lower_name(op) + "\"";
  }
  TORCH_CHECK(false, "cuda_p2p ", what, ": reduce_op must be one of ", names, ", got \"", name,
              "\"");
}

}  // namespace cuda_p2p::ops
