// FlexNPU's PJRT extension chain (PJRT_Api.extension_start): each extension FlexNPU offers
// forwards to the physical backend's, and is offered only when that backend has it.
#ifndef FLEXNPU_C_API_EXTENSIONS_H_
#define FLEXNPU_C_API_EXTENSIONS_H_

#include <memory>

#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/c_api/common.h"

namespace flexnpu::c_api {

// The head of the chain (nullptr: none). Decided once, from the physical backend the
// environment names (FLEXNPU_BACKEND, FLEXNPU_CPU_PLUGIN_PATH: the jax plugin sets the latter
// before it loads FlexNPU); without one FlexNPU offers no extension.
PJRT_Extension_Base* ExtensionChain();

// The physical backend the environment's options name, loaded (nullptr when none loads).
std::shared_ptr<const PhysicalBackend> EnvironmentBackend();

// FlexNPU's Layouts extension forwarding to `backend`'s (c_api/extensions_layouts.cc), or
// nullptr when `backend` lacks it. Called once, by ExtensionChain.
PJRT_Extension_Base* LayoutsExtensionFor(const PhysicalBackend& backend);
// FlexNPU's MemoryDescriptions extension forwarding to `backend`'s
// (c_api/extensions_memory.cc), or nullptr when `backend` lacks it. Called once.
PJRT_Extension_Base* MemoryDescriptionsExtensionFor(const PhysicalBackend& backend);

PJRT_Error* ExecuteContext_Create(PJRT_ExecuteContext_Create_Args* args);
PJRT_Error* ExecuteContext_Destroy(PJRT_ExecuteContext_Destroy_Args* args);

}  // namespace flexnpu::c_api

#endif  // FLEXNPU_C_API_EXTENSIONS_H_
