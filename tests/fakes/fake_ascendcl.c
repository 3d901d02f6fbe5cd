/* A fake libascendcl.so for tests: the real AscendCL names and signatures (vendor_api.h),
 * behaviour scripted by FLEXNPU_FAKE_ACL / FLEXNPU_FAKE_ACL_FILE (fake_script.h). Keys, per
 * physical device N where it says .N:
 *   devices=4                 physical NPUs on the "host" (ASCEND_RT_VISIBLE_DEVICES applies)
 *   soc=Ascend910B2           aclrtGetSocName
 *   memory_total.N / memory_free.N   bytes (aclrtGetMemInfo, aclrtGetDeviceInfo)
 *   aicores.N                 ACL_DEV_ATTR_AICORE_CORE_NUM
 *   cube.N vector.N aicpu.N memutil.N   percent, -1 = unsupported
 *   error.<call>=CODE  message.<call>=TEXT   make <call> fail (e.g. error.aclInit=500002)
 * Build variants: -DFAKE_OMIT_UTILIZATION (no aclrtGetDeviceUtilizationRate, as in older CANN),
 * -DFAKE_OMIT_MEMINFO (no aclrtGetMemInfo: a library FlexNPU cannot use).
 * For assertions: FakeAcl_RefCount(logical id), FakeAcl_InitCount(). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_script.h"
#include "pjrt_flexnpu/hardware/vendor_api.h"

#define FAKE_EXPORT __attribute__((visibility("default")))
enum { kMaxDevices = 64 };

static const fake_script kScript = {"FLEXNPU_FAKE_ACL", "FLEXNPU_FAKE_ACL_FILE"};
static __thread char last_message[512];
static __thread int current_device = -1;
static int ref_count[kMaxDevices];
static int init_count;

static void set_message(const char* text) {
  snprintf(last_message, sizeof(last_message), "%s", text);
}

/* The scripted error of `call`, with its message recorded for aclGetRecentErrMsg. */
static aclError scripted_error(const char* call) {
  char key[96];
  snprintf(key, sizeof(key), "error.%s", call);
  const long long code = fake_int(&kScript, key, -1, 0);
  if (code != 0) {
    char message_key[96];
    char message[400];
    snprintf(message_key, sizeof(message_key), "message.%s", call);
    if (!fake_string(&kScript, message_key, -1, message, sizeof(message))) {
      snprintf(message, sizeof(message), "fake %s failure", call);
    }
    set_message(message);
  }
  return (aclError)code;
}

/* Logical ids as the real runtime makes them: ASCEND_RT_VISIBLE_DEVICES lists physical ids. */
static int visible(int* physical, int max) {
  const int total = (int)fake_int(&kScript, "devices", -1, 0);
  const char* list = getenv("ASCEND_RT_VISIBLE_DEVICES");
  int n = 0;
  if (list == NULL || list[0] == '\0') {
    for (int i = 0; i < total && n < max; ++i) physical[n++] = i;
    return n;
  }
  const char* p = list;
  while (*p != '\0' && n < max) {
    char* end = NULL;
    const long id = strtol(p, &end, 10);
    if (end == p) break;
    if (id >= 0 && id < total) physical[n++] = (int)id;
    p = *end == ',' ? end + 1 : end;
  }
  return n;
}

static int physical_of(int32_t logical) {
  int ids[kMaxDevices];
  const int n = visible(ids, kMaxDevices);
  return logical >= 0 && logical < n ? ids[logical] : -1;
}

static aclError bad_device(int32_t id) {
  char message[128];
  snprintf(message, sizeof(message), "EE1001: device id %d is invalid", (int)id);
  set_message(message);
  return 107001; /* ACL_ERROR_RT_INVALID_DEVICEID */
}

FAKE_EXPORT aclError aclInit(const char* configPath) {
  (void)configPath;
  const aclError e = scripted_error("aclInit");
  if (e != 0) return e;
  __atomic_add_fetch(&init_count, 1, __ATOMIC_SEQ_CST);
  return ACL_SUCCESS;
}

FAKE_EXPORT aclError aclFinalize(void) {
  __atomic_sub_fetch(&init_count, 1, __ATOMIC_SEQ_CST);
  return scripted_error("aclFinalize");
}

FAKE_EXPORT aclError aclrtGetDeviceCount(uint32_t* count) {
  const aclError e = scripted_error("aclrtGetDeviceCount");
  if (e != 0) return e;
  int ids[kMaxDevices];
  *count = (uint32_t)visible(ids, kMaxDevices);
  return ACL_SUCCESS;
}

FAKE_EXPORT aclError aclrtSetDevice(int32_t deviceId) {
  const aclError e = scripted_error("aclrtSetDevice");
  if (e != 0) return e;
  if (physical_of(deviceId) < 0) return bad_device(deviceId);
  __atomic_add_fetch(&ref_count[deviceId], 1, __ATOMIC_SEQ_CST);
  current_device = deviceId;
  return ACL_SUCCESS;
}

FAKE_EXPORT aclError aclrtResetDevice(int32_t deviceId) {
  const aclError e = scripted_error("aclrtResetDevice");
  if (e != 0) return e;
  if (physical_of(deviceId) < 0) return bad_device(deviceId);
  if (__atomic_load_n(&ref_count[deviceId], __ATOMIC_SEQ_CST) <= 0) {
    set_message("EE1002: device was not set");
    return 107003;
  }
  __atomic_sub_fetch(&ref_count[deviceId], 1, __ATOMIC_SEQ_CST);
  if (current_device == deviceId) current_device = -1;
  return ACL_SUCCESS;
}

FAKE_EXPORT const char* aclrtGetSocName(void) {
  static char soc[64];
  if (!fake_string(&kScript, "soc", -1, soc, sizeof(soc))) return NULL;
  return soc;
}

FAKE_EXPORT aclError aclrtGetDeviceInfo(uint32_t deviceId, aclrtDevAttr attr, int64_t* value) {
  const aclError e = scripted_error("aclrtGetDeviceInfo");
  if (e != 0) return e;
  const int physical = physical_of((int32_t)deviceId);
  if (physical < 0) return bad_device((int32_t)deviceId);
  switch (attr) {
    case ACL_DEV_ATTR_AICORE_CORE_NUM:
      *value = fake_int(&kScript, "aicores", physical, 24);
      return ACL_SUCCESS;
    case ACL_DEV_ATTR_TOTAL_GLOBAL_MEM_SIZE:
      *value = fake_int(&kScript, "memory_total", physical, 0);
      return ACL_SUCCESS;
  }
  set_message("EE1003: unsupported attribute");
  return 100000; /* ACL_ERROR_INVALID_PARAM */
}

#ifndef FAKE_OMIT_MEMINFO
FAKE_EXPORT aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t* free, size_t* total) {
  const aclError e = scripted_error("aclrtGetMemInfo");
  if (e != 0) return e;
  if (current_device < 0) {
    set_message("EE1004: no current device in this thread: call aclrtSetDevice first");
    return 107002; /* ACL_ERROR_RT_CONTEXT_NULL */
  }
  if (attr != ACL_HBM_MEM) {
    set_message("EE1003: only ACL_HBM_MEM is faked");
    return 100000;
  }
  const int physical = physical_of(current_device);
  *total = (size_t)fake_int(&kScript, "memory_total", physical, 0);
  *free = (size_t)fake_int(&kScript, "memory_free", physical, (long long)*total);
  return ACL_SUCCESS;
}
#endif

#ifndef FAKE_OMIT_UTILIZATION
FAKE_EXPORT aclError aclrtGetDeviceUtilizationRate(int32_t deviceId,
                                                   aclrtUtilizationInfo* utilizationInfo) {
  const aclError e = scripted_error("aclrtGetDeviceUtilizationRate");
  if (e != 0) return e;
  const int physical = physical_of(deviceId);
  if (physical < 0) return bad_device(deviceId);
  if (utilizationInfo == NULL || utilizationInfo->utilizationExtend != NULL) {
    set_message("EE1003: utilizationExtend must be NULL");
    return 100000;
  }
  utilizationInfo->cubeUtilization = (int32_t)fake_int(&kScript, "cube", physical, -1);
  utilizationInfo->vectorUtilization = (int32_t)fake_int(&kScript, "vector", physical, -1);
  utilizationInfo->aicpuUtilization = (int32_t)fake_int(&kScript, "aicpu", physical, -1);
  utilizationInfo->memoryUtilization = (int32_t)fake_int(&kScript, "memutil", physical, -1);
  return ACL_SUCCESS;
}
#endif

FAKE_EXPORT const char* aclGetRecentErrMsg(void) { return last_message; }

FAKE_EXPORT int FakeAcl_RefCount(int32_t logical) {
  return logical >= 0 && logical < kMaxDevices
             ? __atomic_load_n(&ref_count[logical], __ATOMIC_SEQ_CST)
             : -1;
}

FAKE_EXPORT int FakeAcl_InitCount(void) { return __atomic_load_n(&init_count, __ATOMIC_SEQ_CST); }
