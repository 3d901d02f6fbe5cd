// The daemon protocol: frames round-trip, malformed input is refused with a message, file
// descriptors travel with a frame, and description readers never read past the frame.
#include <dirent.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/remote/protocol.h"
#include "pjrt_flexnpu/backend/remote/remote_backend.h"

namespace flexnpu::daemon {
namespace {

TEST(DaemonProtocol, FrameRoundTripsWithNegativeIntsAndBinaryBlobs) {
  Frame frame;
  frame.call_id = 1234567890123ull;
  frame.op = kExecute;
  frame.code = 8;
  frame.text = "tenant 'a'";
  frame.ints = {0, -1, 1LL << 40, -(1LL << 50)};
  frame.blobs = {std::string("\0\xff\x01", 3), ""};
  Frame decoded;
  ASSERT_TRUE(Decode(Encode(frame), &decoded).ok());
  EXPECT_EQ(decoded.call_id, frame.call_id);
  EXPECT_EQ(decoded.op, frame.op);
  EXPECT_EQ(decoded.code, 8);
  EXPECT_EQ(decoded.text, frame.text);
  EXPECT_EQ(decoded.ints, frame.ints);
  EXPECT_EQ(decoded.blobs, frame.blobs);
}

TEST(DaemonProtocol, TruncatedFrameIsRefused) {
  Frame frame;
  frame.op = kHello;
  frame.text = "a long enough tenant name";
  std::string bytes = Encode(frame);
  bytes.resize(bytes.size() - 5);
  Frame decoded;
  Status s = Decode(bytes, &decoded);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("malformed frame"), std::string::npos) << s.message();
}

TEST(DaemonProtocol, FramesAndDescriptorsCrossASocket) {
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  auto segment = SharedSegment::Create(100000, "test");
  ASSERT_TRUE(segment.ok()) << segment.status().message();
  std::memset(segment->data(), 7, 100000);
  Frame frame;
  frame.op = kBufferFromHost;
  frame.blobs = {std::string(200000, 'x')};  // larger than one socket buffer write
  Frame received;
  std::vector<int> fds;
  std::thread reader([&] { ASSERT_TRUE(RecvFrame(pair[1], &received, &fds).ok()); });
  ASSERT_TRUE(SendFrame(pair[0], frame, {segment->fd()}).ok());
  reader.join();
  EXPECT_EQ(received.blobs, frame.blobs);
  ASSERT_EQ(fds.size(), 1u);
  auto mapped = SharedSegment::Map(fds[0], 100000);
  ASSERT_TRUE(mapped.ok()) << mapped.status().message();
  EXPECT_EQ(static_cast<const char*>(mapped->data())[99999], 7);

  ::close(pair[0]);
  Status eof = RecvFrame(pair[1], &received, &fds);
  EXPECT_EQ(eof.code(), Code::kUnavailable);
  EXPECT_EQ(eof.message(), "closed");
  ::close(pair[1]);
}

TEST(DaemonProtocol, ASegmentShorterThanAnnouncedIsRefused) {
  auto segment = SharedSegment::Create(10, "short");
  ASSERT_TRUE(segment.ok());
  auto mapped = SharedSegment::Map(::dup(segment->fd()), 1 << 20);
  ASSERT_FALSE(mapped.ok());
  EXPECT_NE(mapped.status().message().find("holds 10 bytes"), std::string::npos)
      << mapped.status().message();
}

TEST(DaemonProtocol, DescriptionsRoundTripAndTruncationIsDetected) {
  BufferMeta meta;
  meta.id = 9;
  meta.type = 11;
  meta.on_device_size = 64;
  meta.memory = 2;
  meta.dims = {4, 4};
  meta.layout_type = 0;
  meta.minor_to_major = {1, 0};
  meta.tiles = {{8, 128}, {2}};
  std::vector<int64_t> ints;
  AppendBufferMeta(&ints, meta);
  BufferMeta back;
  IntCursor cursor(ints);
  ASSERT_TRUE(ReadBufferMeta(&cursor, &back));
  EXPECT_EQ(back.dims, meta.dims);
  EXPECT_EQ(back.tiles, meta.tiles);
  EXPECT_EQ(back.minor_to_major, meta.minor_to_major);
  ints.pop_back();
  IntCursor short_cursor(ints);
  EXPECT_FALSE(ReadBufferMeta(&short_cursor, &back));
  // A count larger than what is left is refused, not read past the end.
  std::vector<int64_t> lying = {1, 11, 4, 0, 1000000};
  IntCursor lying_cursor(lying);
  EXPECT_FALSE(ReadBufferMeta(&lying_cursor, &back));
}

// A scripted daemon on a Unix socket: answers Hello with one device and one memory, a
// synchronous BufferFromHost with a 16-byte F32 buffer, BufferToHostSize with 16, and pushes
// each one-way BufferToHost's event when the test says so.
class FakeDaemon {
 public:
  FakeDaemon() {
    path_ = "/tmp/flexnpu_fake_daemon_" + std::to_string(::getpid()) + ".sock";
    ::unlink(path_.c_str());
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listen_fd_, 4), 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeDaemon() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    ::close(listen_fd_);
    ::unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }
  // Pushes the readiness (with 16 bytes of `value`) of the n-th BufferToHost asked for.
  void PushToHost(size_t n, float value) {
    for (int i = 0; i < 5000 && to_host_events_seen_.load() <= n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    Frame push;
    push.op = kEventReady;
    push.ints = {to_host_events_[n], 0};
    float values[4] = {value, value, value, value};
    push.blobs = {std::string(reinterpret_cast<const char*>(values), sizeof(values))};
    std::lock_guard<std::mutex> lock(write_mu_);
    EXPECT_TRUE(SendFrame(fd_, push).ok());
  }

 private:
  void Serve() {
    fd_ = ::accept(listen_fd_, nullptr, nullptr);
    if (fd_ < 0) return;
    for (;;) {
      Frame request;
      std::vector<int> fds;
      if (!RecvFrame(fd_, &request, &fds).ok()) break;
      Frame reply;
      reply.call_id = request.call_id;
      reply.op = request.op;
      if (request.op == kHello) {
        // session 1; 1 memory; 1 device (memory 0); limits [1 MB]; one-way offered
        reply.ints = {1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 1, 1 << 20, 1};
        reply.blobs = {"cpu", "fake", "device", "fake device"};
      } else if (request.op == kBufferFromHost) {
        BufferMeta meta;
        meta.id = 7;
        meta.type = PJRT_Buffer_Type_F32;
        meta.on_device_size = 16;
        meta.memory = 0;
        meta.dims = {4};
        AppendBufferMeta(&reply.ints, meta);
      } else if (request.op == kBufferToHostSize) {
        reply.ints = {16};
      } else if (request.op == kBufferToHost) {
        to_host_events_[to_host_events_seen_.load()] = request.ints[1];
        ++to_host_events_seen_;
      }
      if (request.call_id != 0) {
        std::lock_guard<std::mutex> lock(write_mu_);
        if (!SendFrame(fd_, reply).ok()) break;
      }
    }
    ::close(fd_);
  }
  std::string path_;
  int listen_fd_ = -1;
  int fd_ = -1;
  std::mutex write_mu_;
  int64_t to_host_events_[8] = {};
  std::atomic<size_t> to_host_events_seen_{0};
  std::thread thread_;
};

// A client of a FakeDaemon with one f32[4] {1, 2, 3, 4} uploaded to its device: what both
// client tests start from. Open() returns "" or the first error; the destructor releases all.
struct RemoteSession {
  const PJRT_Api* api = nullptr;
  PJRT_Client* client = nullptr;
  size_t num_devices = 0;
  PJRT_Buffer* buffer = nullptr;

  // The error's message ("" for none), the error destroyed.
  std::string Check(PJRT_Error* error) const {
    if (error == nullptr) return std::string();
    PJRT_Error_Message_Args m{};
    m.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE;
    m.error = error;
    api->PJRT_Error_Message(&m);
    std::string message(m.message, m.message_size);
    PJRT_Error_Destroy_Args d{};
    d.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE;
    d.error = error;
    api->PJRT_Error_Destroy(&d);
    return message.empty() ? "error without a message" : message;
  }

  std::string Open(const PJRT_Api* remote_api) {
    api = remote_api;
    PJRT_Client_Create_Args create{};
    create.struct_size = PJRT_Client_Create_Args_STRUCT_SIZE;
    if (std::string e = Check(api->PJRT_Client_Create(&create)); !e.empty()) return e;
    client = create.client;
    PJRT_Client_AddressableDevices_Args devices{};
    devices.struct_size = PJRT_Client_AddressableDevices_Args_STRUCT_SIZE;
    devices.client = client;
    if (std::string e = Check(api->PJRT_Client_AddressableDevices(&devices)); !e.empty()) return e;
    num_devices = devices.num_addressable_devices;
    if (num_devices == 0) return "no device";
    float host[4] = {1, 2, 3, 4};
    int64_t dims[1] = {4};
    PJRT_Client_BufferFromHostBuffer_Args put{};
    put.struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE;
    put.client = client;
    put.data = host;
    put.type = PJRT_Buffer_Type_F32;
    put.dims = dims;
    put.num_dims = 1;
    put.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
    put.device = devices.addressable_devices[0];
    if (std::string e = Check(api->PJRT_Client_BufferFromHostBuffer(&put)); !e.empty()) return e;
    buffer = put.buffer;
    if (put.done_with_host_buffer != nullptr) {
      PJRT_Event_Destroy_Args done{};
      done.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE;
      done.event = put.done_with_host_buffer;
      api->PJRT_Event_Destroy(&done);
    }
    return "";
  }

  ~RemoteSession() {
    if (buffer != nullptr) {
      PJRT_Buffer_Destroy_Args destroy{};
      destroy.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE;
      destroy.buffer = buffer;
      api->PJRT_Buffer_Destroy(&destroy);
    }
    if (client != nullptr) {
      PJRT_Client_Destroy_Args destroy{};
      destroy.struct_size = PJRT_Client_Destroy_Args_STRUCT_SIZE;
      destroy.client = client;
      api->PJRT_Client_Destroy(&destroy);
    }
  }
};

// The client's reader thread runs OnReady callbacks; the socket must still be read while one
// runs: a callback blocked on a lock of the program's (held by a thread waiting for a reply)
// loses the reading role to another reader thread (before: the reply was never read and the
// call failed at its deadline), and a callback that calls the daemon hands the role over.
TEST(DaemonClient, TheSocketIsReadWhileACallbackWaits) {
  ::setenv("FLEXNPU_DAEMON_TIMEOUT_S", "10", 1);
  FakeDaemon daemon;
  auto backend = remote::RemoteBackend(std::string(remote::kBackendPrefix) + daemon.path());
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  RemoteSession session;
  ASSERT_EQ(session.Open((*backend)->api()), "");
  ASSERT_EQ(session.num_devices, 1u);
  const PJRT_Api* api = session.api;
  auto check = [&](PJRT_Error* error) { return session.Check(error); };
  PJRT_Event_Destroy_Args done{};
  done.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE;

  auto to_host = [&](float* dst) {
    PJRT_Buffer_ToHostBuffer_Args args{};
    args.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE;
    args.src = session.buffer;
    args.dst = dst;
    args.dst_size = dst != nullptr ? 16 : 0;
    EXPECT_EQ(check(api->PJRT_Buffer_ToHostBuffer(&args)), "");
    return args;
  };
  struct Context {
    const PJRT_Api* api;
    PJRT_Buffer* buffer;
    std::mutex* program_lock;
    std::atomic<int> ran{0};
    size_t size_in_callback = 0;
    std::string error_in_callback;
  } context{api, session.buffer, nullptr};

  // 1. A callback blocked on the program's lock while the program waits for a reply.
  std::mutex program_lock;
  context.program_lock = &program_lock;
  float first[4] = {};
  std::unique_lock<std::mutex> held(program_lock);
  PJRT_Event* read = to_host(first).event;
  PJRT_Event_OnReady_Args on_ready{};
  on_ready.struct_size = PJRT_Event_OnReady_Args_STRUCT_SIZE;
  on_ready.event = read;
  on_ready.user_arg = &context;
  on_ready.callback = [](PJRT_Error* error, void* arg) {
    auto* c = static_cast<Context*>(arg);
    if (error != nullptr) c->error_in_callback = "error";
    std::lock_guard<std::mutex> wait_for_the_program(*c->program_lock);
    ++c->ran;
  };
  ASSERT_EQ(check(api->PJRT_Event_OnReady(&on_ready)), "");
  daemon.PushToHost(0, 5.0f);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the callback is running
  const auto start = std::chrono::steady_clock::now();
  PJRT_Buffer_ToHostBuffer_Args size = to_host(nullptr);  // a call: its reply must be read
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(size.dst_size, 16u);
  EXPECT_LT(waited, std::chrono::seconds(5));  // a bound far above the watchdog's 20 ms
  EXPECT_EQ(context.ran.load(), 0);
  held.unlock();
  PJRT_Event_Await_Args await{};
  await.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE;
  await.event = read;
  EXPECT_EQ(check(api->PJRT_Event_Await(&await)), "");
  EXPECT_EQ(first[0], 5.0f);
  for (int i = 0; i < 5000 && context.ran.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(context.ran.load(), 1);
  EXPECT_EQ(context.error_in_callback, "");
  done.event = read;
  api->PJRT_Event_Destroy(&done);

  // 2. A callback that calls the daemon (its reply is read by another reader thread).
  float second[4] = {};
  PJRT_Event* read2 = to_host(second).event;
  on_ready.event = read2;
  on_ready.callback = [](PJRT_Error*, void* arg) {
    auto* c = static_cast<Context*>(arg);
    PJRT_Buffer_ToHostBuffer_Args args{};
    args.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE;
    args.src = c->buffer;
    if (PJRT_Error* e = c->api->PJRT_Buffer_ToHostBuffer(&args)) {
      c->error_in_callback = "size query failed";
      PJRT_Error_Destroy_Args d{};
      d.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE;
      d.error = e;
      c->api->PJRT_Error_Destroy(&d);
    }
    c->size_in_callback = args.dst_size;
    ++c->ran;
  };
  ASSERT_EQ(check(api->PJRT_Event_OnReady(&on_ready)), "");
  daemon.PushToHost(1, 6.0f);
  for (int i = 0; i < 5000 && context.ran.load() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(context.ran.load(), 2);
  EXPECT_EQ(context.size_in_callback, 16u);
  EXPECT_EQ(context.error_in_callback, "");
  EXPECT_EQ(second[0], 6.0f);
  done.event = read2;
  api->PJRT_Event_Destroy(&done);

}

int ThreadsOfThisProcess() {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

// A callback that stays blocked (on a lock of the program's) loses the reading role once: the
// watchdog must not take it again from each next reader (one new thread per tick, several
// threads reading one socket, replies lost), and calls meanwhile are answered.
TEST(DaemonClient, AStuckCallbackCostsOneReaderAndCallsAreAnswered) {
  // A lost reply fails its call in 3 s instead of the default 300 (the bug this guards hung).
  ::setenv("FLEXNPU_DAEMON_TIMEOUT_S", "3", 1);
  FakeDaemon daemon;
  auto backend = remote::RemoteBackend(std::string(remote::kBackendPrefix) + daemon.path());
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  RemoteSession session;
  ASSERT_EQ(session.Open((*backend)->api()), "");
  const PJRT_Api* api = session.api;
  auto failed = [&](PJRT_Error* e) { return !session.Check(e).empty(); };

  static std::mutex program_lock;
  std::unique_lock<std::mutex> held(program_lock);
  float first[4] = {};
  PJRT_Buffer_ToHostBuffer_Args read{};
  read.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE;
  read.src = session.buffer;
  read.dst = first;
  read.dst_size = sizeof(first);
  ASSERT_FALSE(failed(api->PJRT_Buffer_ToHostBuffer(&read)));
  static std::atomic<int> ran{0};
  PJRT_Event_OnReady_Args on_ready{};
  on_ready.struct_size = PJRT_Event_OnReady_Args_STRUCT_SIZE;
  on_ready.event = read.event;
  on_ready.callback = [](PJRT_Error* e, void*) {
    std::lock_guard<std::mutex> lock(program_lock);
    if (e != nullptr) ran = -1000;  // (not expected; the check below then fails)
    ++ran;
  };
  ASSERT_FALSE(failed(api->PJRT_Event_OnReady(&on_ready)));
  const int before = ThreadsOfThisProcess();
  daemon.PushToHost(0, 5.0f);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // ~15 watchdog ticks
  const int stuck = ThreadsOfThisProcess();
  int unanswered = 0;
  for (int i = 0; i < 10; ++i) {
    PJRT_Buffer_ToHostBuffer_Args size{};
    size.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE;
    size.src = session.buffer;
    if (failed(api->PJRT_Buffer_ToHostBuffer(&size)) || size.dst_size != sizeof(first)) {
      ++unanswered;
    }
  }
  EXPECT_EQ(unanswered, 0);
  EXPECT_LE(stuck - before, 2) << "reader threads spawned while one callback was stuck";
  held.unlock();
  for (int i = 0; i < 5000 && ran.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(first[0], 5.0f);

  PJRT_Event_Destroy_Args done{};
  done.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE;
  done.event = read.event;
  api->PJRT_Event_Destroy(&done);
  ::unsetenv("FLEXNPU_DAEMON_TIMEOUT_S");
}

}  // namespace
}  // namespace flexnpu::daemon
