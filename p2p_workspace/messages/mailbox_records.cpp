// The mailbox records (NOTE [Mailbox records]): what a rank publishes in the c10d store for its
// outbox, and their strict parsing (mailboxes.hpp).
#include <c10/util/Exception.h>

#include <string>
#include <vector>

#include "p2p_workspace/messages/mailboxes.hpp"
#include "p2p_workspace/workspace_records.hpp"

namespace cuda_p2p::host {

// NOTE [Mailbox records]
// A rank's mailbox record reaches its peers through the c10d store, which anyone on the machine
// may write (NOTE [Workspace records] in p2p_workspace/workspace_records.cpp). So it is parsed
// strictly: a version line, the slot size (a multiple of 4096 bytes, at most kMaxSlotBytes), the
// region size the slot size implies, and a hex handle of bounded length, each on its own line; a
// bad record breaks the channel from that rank with an error naming it, and nothing is mapped.
constexpr const char* kMailboxRecordVersion = "cuda_p2p-mailbox-v1";
constexpr int64_t kMaxSlotBytes = int64_t{1} << 32;
constexpr size_t kMaxMailboxHandleBytes = 1024;

std::string serialize(const MailboxRecord& r) {
  return std::string(kMailboxRecordVersion) + "\n" + std::to_string(r.slot_bytes) + "\n" +
         std::to_string(r.region_bytes) + "\n" + records::hex(r.handle) + "\n";
}

MailboxRecord parse_mailbox_record(const std::string& s, int src) {
  auto fail = [&](const std::string& what) {
    TORCH_CHECK(
        false, "cuda_p2p recv: rank ", src, "'s mailbox record in the store is invalid (", what,
        "); was it written by another job or process? Record: ", records::quoted_record(s, 120));
  };
  if (s.size() > 64 + 2 * kMaxMailboxHandleBytes) fail("too long");
  std::vector<std::string> lines;
  for (size_t begin = 0; begin < s.size();) {
    const size_t nl = s.find('\n', begin);
    if (nl == std::string::npos) fail("not newline-terminated");
    lines.push_back(s.substr(begin, nl - begin));
    begin = nl + 1;
  }
  if (lines.size() != 4 || lines[0] != kMailboxRecordVersion) {
    fail(std::string("expected 4 lines, the first '") + kMailboxRecordVersion + "'");
  }
  auto number = [&](const std::string& v, const char* field) {
    if (v.empty() || v.size() > 18 || v.find_first_not_of("0123456789") != std::string::npos) {
      fail(std::string(field) + " is not a positive integer");
    }
    return static_cast<int64_t>(std::stoll(v));
  };
  MailboxRecord r;
  r.slot_bytes = number(lines[1], "the slot size");
  r.region_bytes = number(lines[2], "the region size");
  if (r.slot_bytes < 4096 || r.slot_bytes % 4096 != 0 || r.slot_bytes > kMaxSlotBytes) {
    fail("slots of " + lines[1] + " bytes: expected a multiple of 4096 up to " +
         std::to_string(kMaxSlotBytes));
  }
  if (r.region_bytes != Mailboxes::region_bytes_for(r.slot_bytes)) {
    fail("regions of " + lines[2] + " bytes for slots of " + lines[1]);
  }
  const std::string& hex = lines[3];
  if (hex.empty() || hex.size() % 2 != 0 || hex.size() > 2 * kMaxMailboxHandleBytes ||
      hex.find_first_not_of("0123456789abcdef") != std::string::npos) {
    fail("the handle is not 1 to " + std::to_string(kMaxMailboxHandleBytes) + " hex bytes");
  }
  r.handle = records::unhex(hex);  // checked above: lower-case hex of even length
  return r;
}

}  // namespace cuda_p2p::host
