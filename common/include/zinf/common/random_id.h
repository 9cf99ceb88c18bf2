// SPDX-License-Identifier: Apache-2.0
// random_id: 128 bits from the kernel's random source as 32 lowercase hex digits, the identity
// of a checkpoint's run or of one sharded save (no other run, save or process draws it again).
#pragma once

#include <string>
#include <string_view>

namespace zinf {

/// 32 hex digits of getrandom(2). Blocks only until the kernel's pool is initialised (at boot).
/// Throws IoError naming `what` ("a checkpoint's run id") if getrandom fails. Thread-safe.
std::string random_id(std::string_view what);

}  // namespace zinf
