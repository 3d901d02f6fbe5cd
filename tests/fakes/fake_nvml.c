/* A fake libnvidia-ml.so.1 for tests: the real NVML names and signatures (vendor_api.h),
 * scripted by FLEXNPU_FAKE_NVML / FLEXNPU_FAKE_NVML_FILE (fake_script.h). Keys, per NVML
 * index N:
 *   devices=2  name.N=NVIDIA H200  bus.N=00000000:3B:00.0
 *   memory_total.N / memory_free.N   bytes
 *   gpu_util.N / mem_util.N          percent; -1 = NVML_ERROR_NOT_SUPPORTED
 *   error.<call>=CODE                make <call> fail with that nvmlReturn_t
 *   cuda_order=1,0                   (fake_cuda.c) CUDA ordinal i is NVML index list[i]
 * Variant -DFAKE_OMIT_BUS_ID_LOOKUP: no nvmlDeviceGetHandleByPciBusId_v2. */
#include <stdio.h>
#include <string.h>

#include "fake_script.h"
#include "pjrt_flexnpu/hardware/vendor_api.h"

#define FAKE_EXPORT __attribute__((visibility("default")))
enum { kMaxDevices = 64 };

struct nvmlDevice_st {
  int index;
};

static const fake_script kScript = {"FLEXNPU_FAKE_NVML", "FLEXNPU_FAKE_NVML_FILE"};
static struct nvmlDevice_st devices[kMaxDevices];
static int initialised;

static nvmlReturn_t scripted(const char* call) {
  char key[96];
  snprintf(key, sizeof(key), "error.%s", call);
  return (nvmlReturn_t)fake_int(&kScript, key, -1, 0);
}

static int count(void) {
  const int n = (int)fake_int(&kScript, "devices", -1, 0);
  return n < 0 ? 0 : n > kMaxDevices ? kMaxDevices : n;
}

static int index_of(nvmlDevice_t device) {
  if (device < devices || device >= devices + kMaxDevices) return -1;
  const int i = device->index;
  return i < count() ? i : -1;
}

static int parse_bus(const char* text, unsigned* d, unsigned* b, unsigned* dev, unsigned* f) {
  return sscanf(text, "%x:%x:%x.%x", d, b, dev, f) == 4;
}

/* The bus id of NVML index i, in NVML's format (8-digit domain, upper-case hex). */
static void bus_of(int i, char* out, size_t len) {
  char text[64];
  unsigned d = 0, b = 0, dev = 0, f = 0;
  if (!fake_string(&kScript, "bus", i, text, sizeof(text)) || !parse_bus(text, &d, &b, &dev, &f)) {
    d = 0;
    b = (unsigned)(0x10 + i);
    dev = 0;
    f = 0;
  }
  snprintf(out, len, "%08X:%02X:%02X.%X", d, b, dev, f);
}

#define CHECK_INIT(call)                                    \
  do {                                                      \
    if (!initialised) return NVML_ERROR_UNINITIALIZED;      \
    const nvmlReturn_t e = scripted(call);                  \
    if (e != NVML_SUCCESS) return e;                        \
  } while (0)

FAKE_EXPORT nvmlReturn_t nvmlInit_v2(void) {
  const nvmlReturn_t e = scripted("nvmlInit_v2");
  if (e != NVML_SUCCESS) return e;
  for (int i = 0; i < kMaxDevices; ++i) devices[i].index = i;
  initialised = 1;
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlShutdown(void) {
  initialised = 0;
  return NVML_SUCCESS;
}

FAKE_EXPORT const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
  }
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* deviceCount) {
  CHECK_INIT("nvmlDeviceGetCount_v2");
  *deviceCount = (unsigned int)count();
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  CHECK_INIT("nvmlDeviceGetHandleByIndex_v2");
  if ((int)index >= count()) return NVML_ERROR_INVALID_ARGUMENT;
  *device = &devices[index];
  return NVML_SUCCESS;
}

#ifndef FAKE_OMIT_BUS_ID_LOOKUP
FAKE_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* pciBusId,
                                                          nvmlDevice_t* device) {
  CHECK_INIT("nvmlDeviceGetHandleByPciBusId_v2");
  unsigned d, b, dev, f;
  if (pciBusId == NULL || !parse_bus(pciBusId, &d, &b, &dev, &f)) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  for (int i = 0; i < count(); ++i) {
    char mine[32];
    unsigned md, mb, mdev, mf;
    bus_of(i, mine, sizeof(mine));
    parse_bus(mine, &md, &mb, &mdev, &mf);
    if (md == d && mb == b && mdev == dev && mf == f) {
      *device = &devices[i];
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}
#endif

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int* index) {
  CHECK_INIT("nvmlDeviceGetIndex");
  const int i = index_of(device);
  if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
  *index = (unsigned int)i;
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  CHECK_INIT("nvmlDeviceGetName");
  const int i = index_of(device);
  if (i < 0 || name == NULL || length == 0) return NVML_ERROR_INVALID_ARGUMENT;
  if (!fake_string(&kScript, "name", i, name, length)) snprintf(name, length, "NVIDIA H200");
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  CHECK_INIT("nvmlDeviceGetPciInfo_v3");
  const int i = index_of(device);
  if (i < 0 || pci == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  memset(pci, 0, sizeof(*pci));
  bus_of(i, pci->busId, sizeof(pci->busId));
  parse_bus(pci->busId, &pci->domain, &pci->bus, &pci->device, &pci->pciDeviceId);
  pci->pciDeviceId = 0x233510DE;
  snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.0", pci->domain & 0xFFFF,
           pci->bus, pci->device);
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  CHECK_INIT("nvmlDeviceGetMemoryInfo");
  const int i = index_of(device);
  if (i < 0 || memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  memory->total = (unsigned long long)fake_int(&kScript, "memory_total", i, 0);
  memory->free = (unsigned long long)fake_int(&kScript, "memory_free", i, (long long)memory->total);
  memory->used = memory->total - memory->free;
  return NVML_SUCCESS;
}

FAKE_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                       nvmlUtilization_t* utilization) {
  CHECK_INIT("nvmlDeviceGetUtilizationRates");
  const int i = index_of(device);
  if (i < 0 || utilization == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  const long long gpu = fake_int(&kScript, "gpu_util", i, 0);
  const long long mem = fake_int(&kScript, "mem_util", i, 0);
  if (gpu < 0 || mem < 0) return NVML_ERROR_NOT_SUPPORTED;
  utilization->gpu = (unsigned int)gpu;
  utilization->memory = (unsigned int)mem;
  return NVML_SUCCESS;
}
