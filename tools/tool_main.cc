// tools/tool_main.cc: the main of one tool binary; CKPT_TOOL_MAIN names its function.
#include "cli.h"

int main(int argc, char** argv) { return ckpt::tools::CKPT_TOOL_MAIN(argc, argv); }
