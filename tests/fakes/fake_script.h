/* Scripting for the fake vendor libraries: "key=value" entries, separated by ';' or newlines,
 * from an environment variable (inline) or a file named by another one. Re-read on every call,
 * so a test changes what the "hardware" reports by rewriting the file. Per-device keys are
 * "key.N"; a plain "key" applies to every device. Blank values and '#' comments are ignored. */
#ifndef FLEXNPU_TESTS_FAKES_FAKE_SCRIPT_H_
#define FLEXNPU_TESTS_FAKES_FAKE_SCRIPT_H_

#include <stddef.h>

typedef struct fake_script {
  const char* inline_env; /* e.g. "FLEXNPU_FAKE_ACL" */
  const char* file_env;   /* e.g. "FLEXNPU_FAKE_ACL_FILE" */
} fake_script;

/* The value of "key.device" (device >= 0), else of "key", copied into out; 1 if found. */
int fake_string(const fake_script* s, const char* key, int device, char* out, size_t out_len);
long long fake_int(const fake_script* s, const char* key, int device, long long fallback);

#endif
