#include "pjrt_flexnpu/daemon/dispatch.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <utility>

namespace flexnpu::daemon {
namespace {

// One OnReady registration: pushes readiness of client event `event_id`.
struct Watch {
  const PhysicalBackend* backend = nullptr;
  std::shared_ptr<Channel> channel;
  PJRT_Event* inner = nullptr;
  int64_t event_id = 0;  // 0: nothing to push (the segment release of a zero-copy buffer)
  std::function<void(Frame*)> fill;
  std::shared_ptr<void> keep_alive;
  std::function<void()> done;  // runs when the event fires, whatever its status
  // A one-way execution's completion: the arguments it consumed, pushed whatever its status
  // (ints [event, code, donated list]); null for other events.
  std::shared_ptr<const std::vector<int64_t>> donated;
};

void OnWatchReady(PJRT_Error* error, void* arg) {
  std::unique_ptr<Watch> w(static_cast<Watch*>(arg));
  Status status = w->backend->Consume(error, "execution");
  if (w->event_id != 0) {
    Frame push;
    push.op = kEventReady;
    push.ints = {w->event_id, static_cast<int64_t>(status.code())};
    push.text = status.message();
    if (status.ok() && w->fill) w->fill(&push);
    if (w->donated) AppendList(&push.ints, w->donated->data(), w->donated->size());
    w->channel->Send(push);
    if (TenantState* t = w->channel->tenant) {
      ++t->pushes;
      if (!push.blobs.empty()) t->bytes_to_host += static_cast<int64_t>(push.blobs[0].size());
    }
  }
  if (w->done) w->done();
  w->channel->Fired(w->inner);
}

}  // namespace

void Log(const ServerConfig& config, const std::string& line) {
  if (!config.log) return;
  std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  std::fprintf(stderr, "%s flexnpu daemon: %s\n", when, line.c_str());
  std::fflush(stderr);
}

Dispatcher::Dispatcher(const ServerConfig& config, const std::atomic<bool>& stopping,
                       const Server& server)
    : config_(config), stopping_(stopping), server_(server), tenants_(config.tenants) {}

Status Dispatcher::Open() {
  FLEXNPU_RETURN_IF_ERROR(physical_.Open(config_));
  reaper_.Start(&b());
  gate_ = std::make_shared<PriorityGate>(physical_.devices.size(),
                                         std::chrono::milliseconds(config_.batch_max_wait_ms));
  return Status::Ok();
}

Status Dispatcher::Handle(Session& s, const Frame& r, std::vector<int>& fds, Frame* out) {
  switch (r.op) {
    case kBufferFromHost:
      return BufferFromHost(s, r, fds, out);
    case kBufferToHost:
      return ToHost(s, r, fds, out);
    case kBufferToHostSize:
      return ToHostSize(s, r, out);
    case kBufferReadyEvent:
      return ReadyEvent(s, r);
    case kBufferDelete:
      return DeleteBuffer(s, r);
    case kBufferIsDeleted:
      return IsDeleted(s, r, out);
    case kBufferDestroy:
      return DestroyBuffer(s, r);
    case kBufferCopyToMemory:
      return CopyToMemory(s, r, out);
    case kCompile:
      return Compile(s, r, out);
    case kDeserialize:
      return Deserialize(s, r, out);
    case kOptimizedProgram:
    case kSerialize:
    case kExecutableDelete:
    case kExecutableDestroy:
      return ExecutableCall(s, r, out);
    case kExecute:
      return Execute(s, r, out);
    case kStats:
      out->text = server_.StatsJson();
      return Status::Ok();
    default:
      return Unimplemented("flexnpu daemon: unknown op " + std::to_string(r.op));
  }
}

void Dispatcher::WatchEvent(Session& s, PJRT_Event* inner, int64_t event_id,
                            std::function<void(Frame*)> fill, std::shared_ptr<void> keep_alive,
                            std::function<void()> done,
                            std::shared_ptr<const std::vector<int64_t>> donated) {
  auto* w = new Watch{&b(), s.channel, inner, event_id, std::move(fill), std::move(keep_alive),
                      std::move(done), donated};
  s.events.insert(inner);
  PJRT_Event_OnReady_Args args{};
  args.struct_size = PJRT_Event_OnReady_Args_STRUCT_SIZE;
  args.event = inner;
  args.callback = OnWatchReady;
  args.user_arg = w;
  Status st = FLEXNPU_INNER_CALL(b(), PJRT_Event_OnReady, &args);
  if (!st.ok()) {
    std::unique_ptr<Watch> owned(w);
    if (event_id != 0) {
      Frame push;
      push.op = kEventReady;
      push.ints = {event_id, static_cast<int64_t>(st.code())};
      push.text = st.message();
      if (donated) AppendList(&push.ints, donated->data(), donated->size());
      s.channel->Send(push);
    }
    if (w->done) w->done();
    s.channel->Fired(inner);
  }
}

void Dispatcher::DrainFired(Session& s) {
  for (PJRT_Event* e : s.channel->TakeFired()) {
    if (s.events.erase(e) > 0) InnerDeleter<PJRT_Event>{&b()}(e);
  }
}

}  // namespace flexnpu::daemon
