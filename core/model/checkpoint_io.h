// Small POSIX file helpers shared by the checkpoint loaders (config.json,
// model.safetensors.index.json) and writers (safetensors, GGUF). Internal to core/model.
//
// Errors name the path: unreadable -> the errno's code (NOT_FOUND for ENOENT,
// PERMISSION_DENIED, ...); larger than `max_bytes` -> INVALID_ARGUMENT.
// Thread-compatible: touches only its arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace cortiq::model {

// An open, read-only file descriptor of a regular file and its size. The
// caller owns `fd` (close it). Errors name the path: cannot open / stat, or
// not a regular file.
struct OpenedFile {
  int fd = -1;
  uint64_t size = 0;
};
absl::StatusOr<OpenedFile> OpenRegularFile(const std::string& path);

// The whole file as bytes. `max_bytes` guards against reading a multi-GB file
// where a small JSON document is expected.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes);

// Writes `bytes` to path + ".tmp" and renames it onto `path` (readers never
// see a partial file). Errors: the errno's code, naming the path; the
// temporary file is removed on failure.
absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes);

}  // namespace cortiq::model
