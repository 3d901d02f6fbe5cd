/* A fake libcuda.so.1: the CUDA ordinal -> PCI bus id part of the driver API, reading the
 * fake NVML's script (fake_nvml.c): cuda_order=1,0 lists the NVML index of each CUDA ordinal
 * (default: the same order), bus.N the bus ids. Bus ids in CUDA's format (0000:3b:00.0).
 * error.cuInit=CODE makes the driver fail. */
#include <stdio.h>
#include <stdlib.h>

#include "fake_script.h"
#include "pjrt_flexnpu/hardware/vendor_api.h"

#define FAKE_EXPORT __attribute__((visibility("default")))

static const fake_script kScript = {"FLEXNPU_FAKE_NVML", "FLEXNPU_FAKE_NVML_FILE"};
static int initialised;

static int nvml_index(int ordinal) {
  char order[256];
  if (!fake_string(&kScript, "cuda_order", -1, order, sizeof(order))) return ordinal;
  const char* p = order;
  for (int i = 0; *p != '\0'; ++i) {
    char* end = NULL;
    const long v = strtol(p, &end, 10);
    if (end == p) break;
    if (i == ordinal) return (int)v;
    p = *end == ',' ? end + 1 : end;
  }
  return -1;
}

FAKE_EXPORT CUresult cuInit(unsigned int Flags) {
  (void)Flags;
  const CUresult e = (CUresult)fake_int(&kScript, "error.cuInit", -1, 0);
  if (e == 0) initialised = 1;
  return e;
}

FAKE_EXPORT CUresult cuDeviceGetCount(int* count) {
  if (!initialised) return 3; /* CUDA_ERROR_NOT_INITIALIZED */
  *count = (int)fake_int(&kScript, "devices", -1, 0);
  return 0;
}

FAKE_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (!initialised) return 3;
  if (ordinal < 0 || ordinal >= fake_int(&kScript, "devices", -1, 0)) return 101;
  *device = ordinal;
  return 0;
}

FAKE_EXPORT CUresult cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
  if (!initialised) return 3;
  const int i = nvml_index(dev);
  if (i < 0) return 101; /* CUDA_ERROR_INVALID_DEVICE */
  char text[64];
  unsigned d = 0, b = (unsigned)(0x10 + i), device = 0, f = 0;
  if (fake_string(&kScript, "bus", i, text, sizeof(text))) {
    sscanf(text, "%x:%x:%x.%x", &d, &b, &device, &f);
  }
  snprintf(pciBusId, (size_t)len, "%04x:%02x:%02x.%x", d & 0xFFFF, b, device, f);
  return 0;
}
