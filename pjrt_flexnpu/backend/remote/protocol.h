// The daemon protocol (daemon.proto): frames over a Unix-domain socket, with file
// descriptors passed as SCM_RIGHTS. Shared by the remote backend (this folder, the client)
// and the daemon's server (pjrt_flexnpu/daemon/), which keeps the namespace flexnpu::daemon.
#ifndef FLEXNPU_BACKEND_REMOTE_PROTOCOL_H_
#define FLEXNPU_BACKEND_REMOTE_PROTOCOL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "pjrt_flexnpu/base/status.h"

namespace flexnpu::daemon {

// Bumped on any change of a message layout; Hello refuses a mismatch.
// 2: executable replies carry the name. 3: Execute replies list the donated arguments (the
// client answers IsDeleted locally); BufferToHost is one-way (a failure fails its event).
// 4: one-way Execute (client-named outputs), Hello says whether it is offered. 5: one-way
// BufferFromHost (a client-named buffer). 6: a one-way execution's completion pushes list
// the arguments it consumed (ints [event, code, donated list]), and so does a failed one's
// reply or push when it ran before failing. 7: Hello lists each device's memory limit (the
// tenant's quota share). Python's copy (_daemon_wire.PROTOCOL_VERSION) is
// checked against this line by test_daemon.py.
inline constexpr int64_t kProtocolVersion = 7;
// Payloads up to this size travel inside the frame; larger ones in a memfd segment.
inline constexpr size_t kInlinePayloadBytes = 64 * 1024;
// A frame longer than this is refused as malformed.
inline constexpr uint32_t kMaxFrameBytes = 1u << 30;

// Positional arguments per op (ints / blobs; "meta" is a buffer or executable description,
// see the remote backend's entry points and the daemon's server, which share the helpers in
// this header).
enum Op : uint32_t {
  kHello = 1,              // ints [version, role (0 client, 1 observer)], text tenant
                           // -> ints [session] + topology + [bytes limit list (-1:
                           // unknown), one-way execute offered],
                           // blobs [platform, version, kinds...]
  kBufferFromHost = 2,     // ints [type, ndims, dims.., nstrides, strides.., device, memory,
                           // inline, size, client id (0: -> buffer meta; < 0: one-way)]
                           // blobs [data] | fd
  kBufferToHostSize = 3,   // ints [buffer, host layout] -> ints [size]
  kBufferToHost = 4,       // one-way: ints [buffer, event, size, inline, host layout] | fd; the
                           // push carries the bytes when inline, or the error
  kBufferReadyEvent = 5,   // ints [buffer, event] -> ok
  kBufferDelete = 6,       // ints [buffer]
  kBufferIsDeleted = 7,    // ints [buffer] -> ints [deleted]
  kBufferDestroy = 8,      // one-way: ints [buffer]
  kBufferCopyToMemory = 9, // ints [buffer, memory] -> buffer meta
  kCompile = 10,           // blobs [format, code, compile options] -> executable meta
  kDeserialize = 11,       // blobs [bytes, options or empty], ints [has options] -> exe meta
  kOptimizedProgram = 12,  // ints [exe] -> blobs [code, format]
  kSerialize = 13,         // ints [exe] -> blobs [bytes]
  kExecutableDelete = 14,  // ints [exe]
  kExecutableDestroy = 15, // one-way: ints [exe]
  kExecute = 16,           // see Execute in server.cc -> buffer metas, donated argument list
                           // (positions device * num_args + arg); one-way when the request
                           // names the output ids (a failure fails its events and outputs)
  kStats = 17,             // -> text (JSON)
  kEventReady = 100,       // push: ints [event, code, donated list (one-way executions)],
                           // text message, blobs [payload]?
};
// Requests are ops 1..kLastRequestOp.
inline constexpr uint32_t kLastRequestOp = kStats;
// The op's name for stats ("Execute"); "unknown" for others.
const char* OpName(uint32_t op);

struct Frame {
  uint64_t call_id = 0;
  uint32_t op = 0;
  int32_t code = 0;
  std::string text;
  std::vector<int64_t> ints;
  std::vector<std::string> blobs;
};

std::string Encode(const Frame& frame);
Status Decode(const std::string& bytes, Frame* frame);

// Writes one frame (and `fds`, if any) to `socket`. Not thread-safe: callers serialize.
Status SendFrame(int socket, const Frame& frame, const std::vector<int>& fds = {});
// Reads one frame; received descriptors are appended to `fds` (the caller owns them).
// A clean end of stream returns kUnavailable with message "closed".
Status RecvFrame(int socket, Frame* frame, std::vector<int>* fds);

// Sequential reader of a frame's ints with bounds checks.
class IntCursor {
 public:
  explicit IntCursor(const std::vector<int64_t>& ints, size_t pos = 0) : ints_(ints), pos_(pos) {}
  bool Next(int64_t* v) {
    if (pos_ >= ints_.size()) return false;
    *v = ints_[pos_++];
    return true;
  }
  // Reads a count followed by that many values; refuses counts beyond the frame.
  bool List(std::vector<int64_t>* out) {
    int64_t n;
    if (!Next(&n) || n < 0 || static_cast<size_t>(n) > ints_.size() - pos_) return false;
    out->assign(ints_.begin() + pos_, ints_.begin() + pos_ + n);
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  const std::vector<int64_t>& ints_;
  size_t pos_;
};

inline void AppendList(std::vector<int64_t>* ints, const int64_t* values, size_t n) {
  ints->push_back(static_cast<int64_t>(n));
  ints->insert(ints->end(), values, values + n);
}

// Bytes per element of a host buffer of PJRT_Buffer_Type `type` (sub-byte types take one
// byte per element on the host); 0 for types without host data.
size_t HostElementBytes(int type);

// A memfd of `size` bytes mapped read-write; unmapped and closed on destruction.
class SharedSegment {
 public:
  static StatusOr<SharedSegment> Create(size_t size, const char* name);
  // Maps an fd received from a peer; takes ownership of `fd`.
  static StatusOr<SharedSegment> Map(int fd, size_t size);
  SharedSegment() = default;
  SharedSegment(SharedSegment&& other) noexcept { *this = std::move(other); }
  SharedSegment& operator=(SharedSegment&& other) noexcept;
  ~SharedSegment();
  void* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  void* data_ = nullptr;
  size_t size_ = 0;
};


// What a client learns about a buffer when the daemon creates it (all Buffer_* metadata
// queries are answered from it, without a round trip).
struct BufferMeta {
  int64_t id = 0;
  int64_t type = 0;
  int64_t on_device_size = 0;
  int64_t memory = -1;  // index in the daemon's memory list
  std::vector<int64_t> dims;
  std::vector<int64_t> dynamic_dims;
  int64_t layout_type = -1;  // -1: no layout; else PJRT_Buffer_MemoryLayout_Type
  std::vector<int64_t> minor_to_major;
  std::vector<std::vector<int64_t>> tiles;
  std::vector<int64_t> byte_strides;
};
void AppendBufferMeta(std::vector<int64_t>* ints, const BufferMeta& meta);
bool ReadBufferMeta(IntCursor* cursor, BufferMeta* meta);

// A PJRT_Buffer_MemoryLayout as ints (type -1: none), for host layouts of transfers.
struct Layout {
  int64_t type = -1;
  std::vector<int64_t> minor_to_major;
  std::vector<std::vector<int64_t>> tiles;
  std::vector<int64_t> byte_strides;
};
void AppendLayout(std::vector<int64_t>* ints, const Layout& layout);
bool ReadLayout(IntCursor* cursor, Layout* layout);

inline constexpr int kMemoryStatsFields = 11;
struct ExecutableMeta {
  int64_t id = 0;
  int64_t num_replicas = 1;
  int64_t num_partitions = 1;
  int64_t num_outputs = 0;
  bool has_memory_stats = false;
  int64_t memory_stats[kMemoryStatsFields] = {};  // GetCompiledMemoryStats, in header order
  std::vector<int64_t> devices;                   // addressable device indices
  std::string name;  // PJRT_Executable_Name (travels as the reply's first blob)
};
void AppendExecutableMeta(std::vector<int64_t>* ints, const ExecutableMeta& meta);
bool ReadExecutableMeta(IntCursor* cursor, ExecutableMeta* meta);

}  // namespace flexnpu::daemon

#endif  // FLEXNPU_BACKEND_REMOTE_PROTOCOL_H_
