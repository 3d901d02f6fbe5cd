#include "pjrt_flexnpu/backend/remote/handles.h"

namespace flexnpu::remote {

StatusOr<RemoteBuffer*> NewBuffer(RemoteClient* client, IntCursor* cursor) {
  auto buffer = std::make_unique<RemoteBuffer>();
  buffer->client = client;
  buffer->connection = client->connection;
  if (!daemon::ReadBufferMeta(cursor, &buffer->meta)) {
    return Internal("flexnpu daemon at " + client->connection->path() +
                    ": malformed buffer description in a reply");
  }
  return buffer.release();
}

StatusOr<RemoteLoadedExecutable*> NewLoaded(RemoteClient* client, const Frame& reply) {
  auto state = std::make_shared<RemoteExecutableState>();
  state->client = client;
  state->connection = client->connection;
  IntCursor cursor(reply.ints);
  if (!daemon::ReadExecutableMeta(&cursor, &state->meta) || reply.blobs.empty()) {
    return Internal("flexnpu daemon: malformed executable description in a reply");
  }
  state->meta.name = reply.blobs[0];
  for (int64_t index : state->meta.devices) {
    RemoteDevice* device = client->DeviceOfIndex(index);
    if (device == nullptr) return Internal("flexnpu daemon: executable on an unknown device");
    state->devices.push_back(To<PJRT_Device>(device));
  }
  auto* loaded = new RemoteLoadedExecutable();
  loaded->state = std::move(state);
  return loaded;
}

Status BadReply(const RemoteClient* client, const char* what) {
  return Internal("flexnpu daemon at " + client->connection->path() + ": malformed reply to " +
                  what);
}

}  // namespace flexnpu::remote
