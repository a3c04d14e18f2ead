// ckpt/ckpt.h: everything a training program needs from libckpt.
#pragma once

#include "ckpt/checkpoint.h"
#include "ckpt/comm.h"
#include "ckpt/config.h"
#include "ckpt/device.h"
#include "ckpt/dtype.h"
#include "ckpt/error.h"
#include "ckpt/files.h"
#include "ckpt/metadata.h"
#include "ckpt/tensor.h"
