// ckpt/runtime/runtime.h: everything of the training runtime (ckpt::runtime).
#pragma once

#include "ckpt/runtime/accelerator.h"
#include "ckpt/runtime/checkpoint_manager.h"
#include "ckpt/runtime/data.h"
#include "ckpt/runtime/module.h"
#include "ckpt/runtime/optim.h"
#include "ckpt/runtime/stateful.h"
