// SPDX-License-Identifier: Apache-2.0
// Placeholder: implemented on the swap branches.
