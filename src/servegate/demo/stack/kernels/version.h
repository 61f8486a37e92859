#pragma once
// Must match demo_stack.KERNELS_VERSION: the launcher refuses a library of another version.
#define DEMO_KERNELS_VERSION 1
