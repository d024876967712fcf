#pragma once
// Every CPU op with its backward (see the per-family headers).
#include "tp/ops/activation.h"
#include "tp/ops/attention.h"
#include "tp/ops/elementwise.h"
#include "tp/ops/embedding.h"
#include "tp/ops/linear.h"
#include "tp/ops/loss.h"
#include "tp/ops/norm.h"
#include "tp/ops/rope.h"
#include "tp/ops/shape.h"
