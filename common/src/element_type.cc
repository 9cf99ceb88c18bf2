// SPDX-License-Identifier: Apache-2.0
// check_buffer_type: the one refusal of a reduction-only type where a buffer's type is taken
// (zinf/common/element_type.h).
#include "zinf/common/element_type.h"

#include <string>

#include "zinf/common/error.h"

namespace zinf {

void check_buffer_type(ElementType type, std::string_view where) {
  if (is_buffer_type(type)) return;
  throw UsageError(std::string(where) + ": element type " + std::string(element_type_name(type)) +
                   " is not a buffer type (fp32, bf16 or fp16)");
}

}  // namespace zinf
