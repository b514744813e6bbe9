#include "ops/common.hpp"

#include <c10/util/Exception.h>

namespace cuda_p2p::ops {

namespace {

struct ReduceOpName {
  ReduceOp op;
  const char* upper;  // c10d's
  const char* lower;  // the dispatcher ops' and the op signatures'
};

constexpr ReduceOpName kReduceOpNames[] = {
    {ReduceOp::kSum, "SUM", "sum"},
    {ReduceOp::kAvg, "AVG", "avg"},
    {ReduceOp::kProduct, "PRODUCT", "product"},
    {ReduceOp::kMin, "MIN", "min"},
    {ReduceOp::kMax, "MAX", "max"},
    {ReduceOp::kBand, "BAND", "band"},
    {ReduceOp::kBor, "BOR", "bor"},
    {ReduceOp::kBxor, "BXOR", "bxor"},
};

const ReduceOpName* find(ReduceOp op) {
  for (const auto& n : kReduceOpNames) {
    if (n.op == op) return &n;
  }
  return nullptr;
}

}  // namespace

const char* to_string(ReduceOp op) {
  const ReduceOpName* n = find(op);
  return n ? n->upper : "?";
}

std::string lower_name(ReduceOp op) {
  const ReduceOpName* n = find(op);
  return n ? n->lower : "?";
}

ReduceOp parse_reduce_op(std::string_view name, std::initializer_list<ReduceOp> allowed,
                         const char* what) {
  std::string names;
  for (ReduceOp op : allowed) {
    const char* lower = find(op)->lower;
    if (name == lower) return op;
    names += (names.empty() ? "\"" : ", \"") + std::string(lower) + "\"";
  }
  TORCH_CHECK_VALUE(false, "cuda_p2p ", what, ": reduce_op must be one of ", names, ", got \"",
                    std::string(name), "\"");
}

namespace {
constexpr NamedValue<ZeroCopyAgreement> kAgreementNames[] = {
    {ZeroCopyAgreement::kAuto, "auto"},
    {ZeroCopyAgreement::kExchange, "exchange"},
    {ZeroCopyAgreement::kSignature, "signature"},
    {ZeroCopyAgreement::kOff, "off"}};
}  // namespace

const char* to_string(ZeroCopyAgreement a) { return name_of(kAgreementNames, a); }

ZeroCopyAgreement parse_zero_copy_agreement(const std::string& name, const std::string& what) {
  return parse_named(kAgreementNames, name, what);
}

std::string agreement_text(ZeroCopyAgreement a, bool host) {
  const ZeroCopyAgreement resolved = resolve_agreement(a, host);
  if (resolved == resolve_agreement(ZeroCopyAgreement::kAuto, host)) return "";
  return std::string("zero_copy_agreement ") + to_string(resolved);
}

}  // namespace cuda_p2p::ops
