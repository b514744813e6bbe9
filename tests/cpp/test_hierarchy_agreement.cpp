// The agreement of a group spanning hosts (NOTE [Hierarchical agreement] in
// backend/hierarchy_agreement.cpp): its record's strict parse, and the agreement over steps this
// test plays itself, as a peer host that sends a forged block. Single process.
#include <cstring>
#include <vector>

#include "backend/hierarchical.hpp"
#include "backend/hierarchy_agreement.hpp"
#include "tests/cpp/harness.hpp"

namespace cuda_p2p::test {
namespace {

constexpr int64_t R = AgreementRecord::kDescriptorBytes;
const std::string kMalformed =
    "cuda_p2p hierarchical agreement: rank 5's record is malformed: expected ";

std::vector<uint8_t> encoded(const ops::OpSignature& sig) {
  std::vector<uint8_t> bytes(R);
  AgreementRecord::of(sig).encode(bytes.data());
  return bytes;
}

ops::OpSignature all_reduce_sig() {
  return ops::OpSignature::of(ops::OpId::kAllReduce, "8 x float32 sum");
}

// The descriptor's word `i` (ops::encode_signature's layout: stamp, kind | flags | length, text).
uint32_t& word(std::vector<uint8_t>& bytes, int i) {
  return reinterpret_cast<uint32_t*>(bytes.data())[i];
}

void expect_malformed(const std::vector<uint8_t>& bytes, const std::string& expected,
                      int64_t size = R) {
  expect_error([&] { AgreementRecord::decode(bytes.data(), size, 5); }, kMalformed + expected);
}

TEST(HierarchyAgreement, RecordsRoundTrip) {
  const std::string long_text(300, 'x');  // hashed to fit, as ops::encode_signature does
  for (const auto& sig :
       {all_reduce_sig(), ops::OpSignature::of(ops::OpId::kBarrier, ""),
        ops::OpSignature::rejected(ops::OpId::kReduce, "cuda_p2p reduce: bad root"),
        ops::OpSignature::of(ops::OpId::kAllGather, long_text)}) {
    const auto bytes = encoded(sig);
    const AgreementRecord r = AgreementRecord::decode(bytes.data(), R, 5);
    EXPECT_EQ(r.descriptor, AgreementRecord::of(sig).descriptor);
    EXPECT_TRUE(r.same_as(bytes.data()));
  }
}

// The text a descriptor carries (ops::encode_signature's layout).
std::string descriptor_text(const ops::DescriptorWords& w) {
  return std::string(reinterpret_cast<const char*>(&w[2]), w[1] >> 16);
}

// A text too long for its slot is shortened at a word's end with a marker and a hash of the whole
// text (issue 58: errors quoted "got~40260258", half a number and a hash).
TEST(HierarchyAgreement, LongTextsAreShortenedAtAWordsEnd) {
  std::string text = "cuda_p2p all_gather_into_tensor: the output must have world size (2) times";
  text += " the input's 8 elements of Float, got 40260258 of Float (and more words after it)";
  ASSERT_GT(text.size(), 120u);
  const auto w = ops::encode_signature(ops::OpSignature::of(ops::OpId::kAllGather, text), 0);
  const std::string got = descriptor_text(w);
  EXPECT_LE(got.size(), 120u);
  const size_t marker = got.find(" ... #");
  ASSERT_NE(marker, std::string::npos) << got;
  EXPECT_EQ(got.size(), marker + 6 + 8) << got;                  // the marker, then 8 hex digits
  EXPECT_EQ(text.compare(0, marker, got, 0, marker), 0) << got;  // a prefix of the text...
  const char next = text[marker];
  EXPECT_TRUE(next == ' ' || next == ',') << got;  // ...ending where a word ends
  // Texts that differ only past the cut still differ.
  std::string other = text;
  other.back() = ']';
  EXPECT_NE(got, descriptor_text(
                     ops::encode_signature(ops::OpSignature::of(ops::OpId::kAllGather, other), 0)));
  // One word longer than the slot is cut where it must be.
  const std::string word(300, 'x');
  const std::string cut =
      descriptor_text(ops::encode_signature(ops::OpSignature::of(ops::OpId::kBarrier, word), 0));
  EXPECT_EQ(cut.size(), 120u);
  EXPECT_EQ(cut.substr(0, 106), std::string(106, 'x'));
}

TEST(HierarchyAgreement, MalformedRecordsRaiseNamingTheRank) {
  const auto good = encoded(all_reduce_sig());
  expect_malformed(good, "a descriptor of 128 bytes, got 12", 12);
  expect_malformed(good, "a descriptor of 128 bytes, got 0", 0);

  auto bad = good;
  word(bad, 0) = 2;  // a second handshake's stamp: the agreement is every call's first
  expect_malformed(bad, "stamp 1, got 2");
  bad = good;
  word(bad, 0) = 0;  // never written
  expect_malformed(bad, "stamp 1, got 0");
  bad = good;
  const std::string kinds = "an op kind in [1, " + std::to_string(ops::kOpCount + 1) + "), got ";
  word(bad, 1) &= ~0xffu;  // kind 0
  expect_malformed(bad, kinds + "0");
  bad = good;
  word(bad, 1) = (word(bad, 1) & ~0xffu) | (ops::kOpCount + 1);  // one past the last op
  expect_malformed(bad, kinds + std::to_string(ops::kOpCount + 1));
  bad = good;
  word(bad, 1) = (word(bad, 1) & ~0xffu) | 99u;
  expect_malformed(bad, kinds + "99");
  bad = good;
  word(bad, 1) |= 1u << 9;
  expect_malformed(bad, "no flag but invalid (0x100), got 0x200");
  bad = good;
  word(bad, 1) = (word(bad, 1) & 0xffffu) | (121u << 16);
  expect_malformed(bad, "a text of at most 120 bytes, got 121");
  bad = good;
  bad[8 + 20] = 'y';  // after "8 x float32 sum" (15 bytes)
  expect_malformed(bad, "zeros after its text of 15 bytes, got byte 121 at 20");
  // An all-zero record (a slot nobody wrote) is refused too.
  expect_malformed(std::vector<uint8_t>(R, 0), "stamp 1, got 0");
}

// Rank 0 of a group of two hosts of one rank each: the intra steps are this rank alone, and the
// inter all-gather delivers this rank's block and `peer`'s (rank 1's) as host 1's.
AgreementSteps steps_with_peer(const std::vector<uint8_t>& peer) {
  return {.intra_all_gather = [](const at::Tensor& out, const at::Tensor& in) { out.copy_(in); },
          .inter_all_gather =
              [peer](const at::Tensor& out, const at::Tensor& in) {
                const int64_t block = in.numel();
                out.narrow(0, 0, block).copy_(in);
                out.narrow(0, block, block).zero_();
                std::memcpy(out.data_ptr<uint8_t>() + block, peer.data(), peer.size());
              },
          .intra_broadcast =
              [](const at::Tensor&, int) {
                ADD_FAILURE() << "even hosts hand nothing on after the inter step";
              }};
}

TEST(HierarchyAgreement, AgreesParsesAndComparesEveryRank) {
  const HostLayout layout({10, 20});
  HierarchyAgreement agreement(layout, 0);
  // Agreed, and a small all-reduce rides along: the peer's payload area is zero, so the sum is
  // this rank's own tensor.
  at::Tensor t = at::arange(8, at::kFloat);
  EXPECT_TRUE(agreement.agree(all_reduce_sig(), steps_with_peer(encoded(all_reduce_sig())), t,
                              c10d::ReduceOp(c10d::ReduceOp::SUM)));
  EXPECT_TRUE(t.equal(at::arange(8, at::kFloat)));
  // The peer passed something else: the mismatch every rank raises.
  expect_error(
      [&] {
        agreement.agree(all_reduce_sig(), steps_with_peer(encoded(ops::OpSignature::of(
                                              ops::OpId::kAllReduce, "9 x float32 sum"))));
      },
      "cuda_p2p all_reduce: ranks disagree: rank 0 passed 8 x float32 sum, rank 1 passed 9 x "
      "float32 sum; the op did not run on any rank");
  // The peer's record is malformed: refused by name, not compared.
  auto bad = encoded(all_reduce_sig());
  word(bad, 0) = 7;
  expect_error([&] { agreement.agree(all_reduce_sig(), steps_with_peer(bad)); },
               "cuda_p2p hierarchical agreement: rank 1's record is malformed: expected stamp 1, "
               "got 7");
}

}  // namespace
}  // namespace cuda_p2p::test
