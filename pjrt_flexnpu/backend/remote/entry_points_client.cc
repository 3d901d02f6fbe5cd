// The client (its creation is the daemon session's handshake), its devices and memories: the
// topology the daemon sent at Hello answers every query.
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "pjrt_flexnpu/backend/remote/entry_points.h"
#include "pjrt_flexnpu/backend/remote/handles.h"

namespace flexnpu::remote {

PJRT_Error* Client_Create(PJRT_Client_Create_Args* a) {
  return Run([&]() -> Status {
    auto connection = Connection::Open(SocketPath());
    if (!connection.ok()) return connection.status();
    // Until the client owns it: a failed handshake closes the session.
    struct CloseUnlessKept {
      Connection* c;
      ~CloseUnlessKept() {
        if (c != nullptr) c->Close();
      }
    } close_unless_kept{connection->get()};
    Frame hello;
    hello.op = daemon::kHello;
    hello.ints = {daemon::kProtocolVersion, 0};
    // The tenant: create option "tenant" (FlexNPU's runtime passes its own tenant option,
    // FLEXNPU_TENANT included, this way), else FLEXNPU_TENANT for a direct user of this API.
    if (const char* tenant = std::getenv("FLEXNPU_TENANT")) hello.text = tenant;
    for (size_t i = 0; i < a->num_options; ++i) {
      const PJRT_NamedValue& option = a->create_options[i];
      if (std::string_view(option.name, option.name_size) != "tenant") continue;
      if (option.type != PJRT_NamedValue_kString) {
        return InvalidArgument("flexnpu daemon client: create option 'tenant' must be a string");
      }
      hello.text.assign(option.string_value, option.value_size);
    }
    auto reply = (*connection)->Call(std::move(hello));
    if (!reply.ok()) return reply.status();
    auto client = std::make_unique<RemoteClient>();
    client->connection = *connection;
    // ints: [session, num_memories, (index, id, kind_id)..., num_devices,
    //        (index, id, local_hw, default_memory, memories list)..., bytes limit list,
    //        one-way offered]
    // blobs: [platform, version, memory kinds..., device kinds...]
    IntCursor c(reply->ints);
    int64_t num_memories, num_devices;
    if (!c.Next(&client->session) || !c.Next(&num_memories) || num_memories < 0 ||
        reply->blobs.size() < 2 + static_cast<size_t>(num_memories)) {
      return BadReply(client.get(), "Hello");
    }
    client->platform_name = reply->blobs[0];
    client->platform_version = reply->blobs[1];
    for (int64_t m = 0; m < num_memories; ++m) {
      auto memory = std::make_unique<RemoteMemory>();
      if (!c.Next(&memory->index) || !c.Next(&memory->id) || !c.Next(&memory->kind_id)) {
        return BadReply(client.get(), "Hello");
      }
      memory->kind = reply->blobs[2 + m];
      memory->debug = "daemon memory " + std::to_string(memory->id) + " (" + memory->kind + ")";
      client->memory_handles.push_back(To<PJRT_Memory>(memory.get()));
      client->memories[memory->index] = std::move(memory);
    }
    if (!c.Next(&num_devices) || num_devices <= 0 ||
        reply->blobs.size() < 2 + static_cast<size_t>(num_memories + num_devices)) {
      return BadReply(client.get(), "Hello");
    }
    for (int64_t d = 0; d < num_devices; ++d) {
      auto device = std::make_unique<RemoteDevice>();
      device->client = client.get();
      int64_t default_memory;
      std::vector<int64_t> memories;
      if (!c.Next(&device->index) || !c.Next(&device->id) || !c.Next(&device->local_hardware_id) ||
          !c.Next(&default_memory) || !c.List(&memories)) {
        return BadReply(client.get(), "Hello");
      }
      device->kind = reply->blobs[2 + num_memories + d];
      device->debug = "daemon device " + std::to_string(device->id) + " (" + device->kind + ")";
      device->default_memory = client->Memory(default_memory);
      for (int64_t m : memories) {
        RemoteMemory* memory = client->Memory(m);
        if (memory == nullptr) return BadReply(client.get(), "Hello");
        device->memories.push_back(To<PJRT_Memory>(memory));
        memory->devices.push_back(To<PJRT_Device>(device.get()));
      }
      client->device_handles.push_back(To<PJRT_Device>(device.get()));
      client->devices.push_back(std::move(device));
    }
    std::vector<int64_t> limits;
    if (!c.List(&limits) || limits.size() != client->devices.size()) {
      return BadReply(client.get(), "Hello");
    }
    for (size_t d = 0; d < limits.size(); ++d) client->devices[d]->bytes_limit = limits[d];
    int64_t one_way = 0;
    client->one_way = c.Next(&one_way) && one_way == 1;
    a->client = To<PJRT_Client>(client.release());
    close_unless_kept.c = nullptr;
    return Status::Ok();
  });
}

PJRT_Error* Client_Destroy(PJRT_Client_Destroy_Args* a) {
  RemoteClient* client = From<RemoteClient>(a->client);
  client->connection->Close();  // ends the session; buffers outliving it are gone with it
  delete client;
  return nullptr;
}
PJRT_Error* Client_PlatformName(PJRT_Client_PlatformName_Args* a) {
  const RemoteClient* c = From<RemoteClient>(a->client);
  a->platform_name = c->platform_name.data();
  a->platform_name_size = c->platform_name.size();
  return nullptr;
}
PJRT_Error* Client_PlatformVersion(PJRT_Client_PlatformVersion_Args* a) {
  return own_api::ClientPlatformVersion<RemoteClient>(a);
}
PJRT_Error* Client_ProcessIndex(PJRT_Client_ProcessIndex_Args* a) {
  return own_api::ClientProcessIndex(a);
}
PJRT_Error* Client_Devices(PJRT_Client_Devices_Args* a) {
  return own_api::ClientDevices<RemoteClient>(a);
}
PJRT_Error* Client_AddressableDevices(PJRT_Client_AddressableDevices_Args* a) {
  return own_api::ClientAddressableDevices<RemoteClient>(a);
}
PJRT_Error* Client_AddressableMemories(PJRT_Client_AddressableMemories_Args* a) {
  return own_api::ClientAddressableMemories<RemoteClient>(a);
}

// Device descriptions are the devices themselves.
PJRT_Error* DeviceDescription_Id(PJRT_DeviceDescription_Id_Args* a) {
  a->id = static_cast<int>(From<RemoteDevice>(a->device_description)->id);
  return nullptr;
}
PJRT_Error* DeviceDescription_ProcessIndex(PJRT_DeviceDescription_ProcessIndex_Args* a) {
  a->process_index = 0;
  return nullptr;
}
PJRT_Error* DeviceDescription_Attributes(PJRT_DeviceDescription_Attributes_Args* a) {
  a->attributes = nullptr;
  a->num_attributes = 0;
  return nullptr;
}
PJRT_Error* DeviceDescription_Kind(PJRT_DeviceDescription_Kind_Args* a) {
  const RemoteDevice* d = From<RemoteDevice>(a->device_description);
  a->device_kind = d->kind.data();
  a->device_kind_size = d->kind.size();
  return nullptr;
}
PJRT_Error* DeviceDescription_DebugString(PJRT_DeviceDescription_DebugString_Args* a) {
  const RemoteDevice* d = From<RemoteDevice>(a->device_description);
  a->debug_string = d->debug.data();
  a->debug_string_size = d->debug.size();
  return nullptr;
}
PJRT_Error* DeviceDescription_ToString(PJRT_DeviceDescription_ToString_Args* a) {
  const RemoteDevice* d = From<RemoteDevice>(a->device_description);
  a->to_string = d->debug.data();
  a->to_string_size = d->debug.size();
  return nullptr;
}
PJRT_Error* Device_GetDescription(PJRT_Device_GetDescription_Args* a) {
  a->device_description = reinterpret_cast<PJRT_DeviceDescription*>(a->device);
  return nullptr;
}
PJRT_Error* Device_IsAddressable(PJRT_Device_IsAddressable_Args* a) {
  a->is_addressable = true;
  return nullptr;
}
PJRT_Error* Device_LocalHardwareId(PJRT_Device_LocalHardwareId_Args* a) {
  a->local_hardware_id = static_cast<int>(From<RemoteDevice>(a->device)->local_hardware_id);
  return nullptr;
}
PJRT_Error* Device_AddressableMemories(PJRT_Device_AddressableMemories_Args* a) {
  const RemoteDevice* d = From<RemoteDevice>(a->device);
  a->memories = d->memories.data();
  a->num_memories = d->memories.size();
  return nullptr;
}
PJRT_Error* Device_DefaultMemory(PJRT_Device_DefaultMemory_Args* a) {
  const RemoteDevice* d = From<RemoteDevice>(a->device);
  if (d->default_memory == nullptr) {
    return ToError(NotFound("daemon device " + std::to_string(d->id) + " has no default memory"));
  }
  a->memory = To<PJRT_Memory>(d->default_memory);
  return nullptr;
}
// The limit the daemon gave the session (its tenant's quota share); bytes in use are counted
// by FlexNPU's runtime above this backend, per virtual device, and are not asked here.
PJRT_Error* Device_MemoryStats(PJRT_Device_MemoryStats_Args* a) {
  const RemoteDevice* d = From<RemoteDevice>(a->device);
  const size_t header = offsetof(PJRT_Device_MemoryStats_Args, bytes_in_use);
  const size_t size = std::min(a->struct_size, sizeof(PJRT_Device_MemoryStats_Args));
  if (size > header) std::memset(reinterpret_cast<char*>(a) + header, 0, size - header);
  if (d->bytes_limit >= 0) {
    a->bytes_limit = d->bytes_limit;
    a->bytes_limit_is_set = true;
  }
  return nullptr;
}

PJRT_Error* Memory_Id(PJRT_Memory_Id_Args* a) {
  a->id = static_cast<int>(From<RemoteMemory>(a->memory)->id);
  return nullptr;
}
PJRT_Error* Memory_Kind(PJRT_Memory_Kind_Args* a) {
  const RemoteMemory* m = From<RemoteMemory>(a->memory);
  a->kind = m->kind.data();
  a->kind_size = m->kind.size();
  return nullptr;
}
PJRT_Error* Memory_Kind_Id(PJRT_Memory_Kind_Id_Args* a) {
  a->kind_id = static_cast<int>(From<RemoteMemory>(a->memory)->kind_id);
  return nullptr;
}
PJRT_Error* Memory_DebugString(PJRT_Memory_DebugString_Args* a) {
  const RemoteMemory* m = From<RemoteMemory>(a->memory);
  a->debug_string = m->debug.data();
  a->debug_string_size = m->debug.size();
  return nullptr;
}
PJRT_Error* Memory_ToString(PJRT_Memory_ToString_Args* a) {
  const RemoteMemory* m = From<RemoteMemory>(a->memory);
  a->to_string = m->debug.data();
  a->to_string_size = m->debug.size();
  return nullptr;
}
PJRT_Error* Memory_AddressableByDevices(PJRT_Memory_AddressableByDevices_Args* a) {
  const RemoteMemory* m = From<RemoteMemory>(a->memory);
  a->devices = m->devices.data();
  a->num_devices = m->devices.size();
  return nullptr;
}

}  // namespace flexnpu::remote
