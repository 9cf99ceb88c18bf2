# SPDX-License-Identifier: Apache-2.0
"""Drop-in replacements for other offload libraries' Python APIs (zinf.compat.deepspeed)."""
