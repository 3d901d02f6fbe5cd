#include "pjrt_flexnpu/backend/remote/protocol.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/base/wire.h"

namespace flexnpu::daemon {
namespace {

constexpr size_t kMaxFds = 8;

Status Errno(const char* what) {
  return Status(Code::kUnavailable, std::string(what) + ": " + std::strerror(errno));
}

}  // namespace

std::string Encode(const Frame& frame) {
  proto::Writer w;
  if (frame.call_id != 0) w.Varint(1, frame.call_id);
  w.Varint(2, frame.op);
  if (frame.code != 0) w.Varint(3, static_cast<uint64_t>(frame.code));
  if (!frame.text.empty()) w.Bytes(4, frame.text);
  if (!frame.ints.empty()) w.PackedVarints(5, frame.ints);
  for (const std::string& blob : frame.blobs) w.Bytes(6, blob);
  return w.Take();
}

Status Decode(const std::string& bytes, Frame* frame) {
  proto::Reader reader(bytes);
  proto::Field field;
  while (reader.Next(&field)) {
    switch (field.number) {
      case 1: frame->call_id = field.value; break;
      case 2: frame->op = static_cast<uint32_t>(field.value); break;
      case 3: frame->code = static_cast<int32_t>(field.value); break;
      case 4: frame->text.assign(field.bytes); break;
      case 5:
        if (!proto::AppendVarints(field, &frame->ints)) {
          return InvalidArgument("daemon protocol: malformed ints in a frame");
        }
        break;
      case 6: frame->blobs.emplace_back(field.bytes); break;
      default: break;  // newer fields are skipped
    }
  }
  if (!reader.ok()) return InvalidArgument("daemon protocol: malformed frame: " + reader.error());
  return Status::Ok();
}

Status SendFrame(int socket, const Frame& frame, const std::vector<int>& fds) {
  const std::string body = Encode(frame);
  if (body.size() > kMaxFrameBytes) return InvalidArgument("daemon protocol: frame too large");
  std::string data(4, '\0');
  const uint32_t n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) data[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  data += body;
  size_t sent = 0;
  bool fds_sent = fds.empty();
  while (sent < data.size()) {
    iovec iov{data.data() + sent, data.size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
    if (!fds_sent) {
      if (fds.size() > kMaxFds) return InvalidArgument("daemon protocol: too many fds");
      std::memset(control, 0, sizeof(control));
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    const ssize_t r = ::sendmsg(socket, &msg, MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno("send");
    }
    fds_sent = true;
    sent += static_cast<size_t>(r);
  }
  return Status::Ok();
}

namespace {

// Reads exactly `n` bytes, collecting any descriptors that arrive.
Status ReadFull(int socket, char* out, size_t n, std::vector<int>* fds, bool* eof_at_start) {
  size_t got = 0;
  while (got < n) {
    iovec iov{out + got, n - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t r = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno("recv");
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds->push_back(fd);
      }
    }
    if (r == 0) {
      if (got == 0 && eof_at_start != nullptr) *eof_at_start = true;
      return Status(Code::kUnavailable, got == 0 ? "closed" : "connection closed mid-frame");
    }
    got += static_cast<size_t>(r);
  }
  return Status::Ok();
}

}  // namespace

Status RecvFrame(int socket, Frame* frame, std::vector<int>* fds) {
  unsigned char header[4];
  bool eof = false;
  FLEXNPU_RETURN_IF_ERROR(ReadFull(socket, reinterpret_cast<char*>(header), 4, fds, &eof));
  const uint32_t n = header[0] | (header[1] << 8) | (header[2] << 16) |
                     (static_cast<uint32_t>(header[3]) << 24);
  if (n > kMaxFrameBytes) return InvalidArgument("daemon protocol: frame length too large");
  std::string body(n, '\0');
  FLEXNPU_RETURN_IF_ERROR(ReadFull(socket, body.data(), n, fds, nullptr));
  *frame = Frame();
  return Decode(body, frame);
}

const char* OpName(uint32_t op) {
  switch (op) {
    case kHello: return "Hello";
    case kBufferFromHost: return "BufferFromHost";
    case kBufferToHostSize: return "BufferToHostSize";
    case kBufferToHost: return "BufferToHost";
    case kBufferReadyEvent: return "BufferReadyEvent";
    case kBufferDelete: return "BufferDelete";
    case kBufferIsDeleted: return "BufferIsDeleted";
    case kBufferDestroy: return "BufferDestroy";
    case kBufferCopyToMemory: return "BufferCopyToMemory";
    case kCompile: return "Compile";
    case kDeserialize: return "Deserialize";
    case kOptimizedProgram: return "OptimizedProgram";
    case kSerialize: return "Serialize";
    case kExecutableDelete: return "ExecutableDelete";
    case kExecutableDestroy: return "ExecutableDestroy";
    case kExecute: return "Execute";
    case kStats: return "Stats";
    case kEventReady: return "EventReady";
    default: return "unknown";
  }
}

size_t HostElementBytes(int type) {
  switch (type) {
    case PJRT_Buffer_Type_PRED:
    case PJRT_Buffer_Type_S8:
    case PJRT_Buffer_Type_U8:
    case PJRT_Buffer_Type_F8E5M2:
    case PJRT_Buffer_Type_F8E4M3FN:
    case PJRT_Buffer_Type_F8E4M3B11FNUZ:
    case PJRT_Buffer_Type_F8E5M2FNUZ:
    case PJRT_Buffer_Type_F8E4M3FNUZ:
    case PJRT_Buffer_Type_S4:
    case PJRT_Buffer_Type_U4:
    case PJRT_Buffer_Type_S2:
    case PJRT_Buffer_Type_U2:
    case PJRT_Buffer_Type_F8E4M3:
    case PJRT_Buffer_Type_F8E3M4:
    case PJRT_Buffer_Type_F8E8M0FNU:
    case PJRT_Buffer_Type_F4E2M1FN:
      return 1;
    case PJRT_Buffer_Type_S16:
    case PJRT_Buffer_Type_U16:
    case PJRT_Buffer_Type_F16:
    case PJRT_Buffer_Type_BF16:
      return 2;
    case PJRT_Buffer_Type_S32:
    case PJRT_Buffer_Type_U32:
    case PJRT_Buffer_Type_F32:
      return 4;
    case PJRT_Buffer_Type_S64:
    case PJRT_Buffer_Type_U64:
    case PJRT_Buffer_Type_F64:
    case PJRT_Buffer_Type_C64:
      return 8;
    case PJRT_Buffer_Type_C128:
      return 16;
    default:
      return 0;
  }
}

StatusOr<SharedSegment> SharedSegment::Create(size_t size, const char* name) {
  const int fd = ::memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return Errno("memfd_create");
  if (::ftruncate(fd, static_cast<off_t>(size == 0 ? 1 : size)) != 0) {
    Status s = Errno("ftruncate of a shared segment");
    ::close(fd);
    return s;
  }
  return Map(fd, size);
}

StatusOr<SharedSegment> SharedSegment::Map(int fd, size_t size) {
  SharedSegment segment;
  segment.fd_ = fd;
  segment.size_ = size;
  // A segment shorter than announced would fault (SIGBUS) on access: refuse it.
  struct stat info {};
  if (::fstat(fd, &info) != 0) return Errno("fstat of a shared segment");
  if (static_cast<uint64_t>(info.st_size) < size) {
    return InvalidArgument("shared segment holds " + std::to_string(info.st_size) +
                           " bytes, the request names " + std::to_string(size));
  }
  void* data = ::mmap(nullptr, size == 0 ? 1 : size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) return Errno("mmap of a shared segment");
  segment.data_ = data;
  return segment;
}

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    this->~SharedSegment();
    fd_ = other.fd_;
    data_ = other.data_;
    size_ = other.size_;
    other.fd_ = -1;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

SharedSegment::~SharedSegment() {
  if (data_ != nullptr) ::munmap(data_, size_ == 0 ? 1 : size_);
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  fd_ = -1;
}

}  // namespace flexnpu::daemon

namespace flexnpu::daemon {

void AppendBufferMeta(std::vector<int64_t>* ints, const BufferMeta& m) {
  ints->insert(ints->end(), {m.id, m.type, m.on_device_size, m.memory});
  AppendList(ints, m.dims.data(), m.dims.size());
  AppendList(ints, m.dynamic_dims.data(), m.dynamic_dims.size());
  ints->push_back(m.layout_type);
  AppendList(ints, m.minor_to_major.data(), m.minor_to_major.size());
  ints->push_back(static_cast<int64_t>(m.tiles.size()));
  for (const auto& tile : m.tiles) AppendList(ints, tile.data(), tile.size());
  AppendList(ints, m.byte_strides.data(), m.byte_strides.size());
}

bool ReadBufferMeta(IntCursor* c, BufferMeta* m) {
  int64_t num_tiles;
  if (!c->Next(&m->id) || !c->Next(&m->type) || !c->Next(&m->on_device_size) ||
      !c->Next(&m->memory) || !c->List(&m->dims) || !c->List(&m->dynamic_dims) ||
      !c->Next(&m->layout_type) || !c->List(&m->minor_to_major) || !c->Next(&num_tiles) ||
      num_tiles < 0 || num_tiles > 64) {
    return false;
  }
  m->tiles.resize(num_tiles);
  for (auto& tile : m->tiles) {
    if (!c->List(&tile)) return false;
  }
  return c->List(&m->byte_strides);
}

void AppendLayout(std::vector<int64_t>* ints, const Layout& l) {
  ints->push_back(l.type);
  AppendList(ints, l.minor_to_major.data(), l.minor_to_major.size());
  ints->push_back(static_cast<int64_t>(l.tiles.size()));
  for (const auto& tile : l.tiles) AppendList(ints, tile.data(), tile.size());
  AppendList(ints, l.byte_strides.data(), l.byte_strides.size());
}

bool ReadLayout(IntCursor* c, Layout* l) {
  int64_t num_tiles;
  if (!c->Next(&l->type) || !c->List(&l->minor_to_major) || !c->Next(&num_tiles) ||
      num_tiles < 0 || num_tiles > 64) {
    return false;
  }
  l->tiles.resize(num_tiles);
  for (auto& tile : l->tiles) {
    if (!c->List(&tile)) return false;
  }
  return c->List(&l->byte_strides);
}

void AppendExecutableMeta(std::vector<int64_t>* ints, const ExecutableMeta& m) {
  ints->insert(ints->end(), {m.id, m.num_replicas, m.num_partitions, m.num_outputs,
                             m.has_memory_stats ? 1 : 0});
  ints->insert(ints->end(), m.memory_stats, m.memory_stats + kMemoryStatsFields);
  AppendList(ints, m.devices.data(), m.devices.size());
}

bool ReadExecutableMeta(IntCursor* c, ExecutableMeta* m) {
  int64_t has_stats;
  if (!c->Next(&m->id) || !c->Next(&m->num_replicas) || !c->Next(&m->num_partitions) ||
      !c->Next(&m->num_outputs) || !c->Next(&has_stats)) {
    return false;
  }
  m->has_memory_stats = has_stats != 0;
  for (int64_t& v : m->memory_stats) {
    if (!c->Next(&v)) return false;
  }
  return c->List(&m->devices);
}

}  // namespace flexnpu::daemon
