/* vkshmem-verbs native helper: see vkv.h. One translation unit (cffi API mode). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <infiniband/verbs.h>

#include "vkv.h"

#include "vkv_pure.c"
#include "vkv_dev.c"
#include "vkv_data.c"
#include "vkv_model.c"
