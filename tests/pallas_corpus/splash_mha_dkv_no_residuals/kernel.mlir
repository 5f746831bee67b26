module attributes {stable_mosaic.version = 15 : i64} {
  func.func @splash_mha_dkv_no_residuals(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg5: memref<1x128x128xbf16, #tpu.memory_space<vmem>>, %arg6: memref<1x256x128xbf16, #tpu.memory_space<vmem>>, %arg7: memref<1x256x128xbf16, #tpu.memory_space<vmem>>, %arg8: memref<1x8x128xf32, #tpu.memory_space<vmem>>, %arg9: memref<1x128x128xbf16, #tpu.memory_space<vmem>>, %arg10: memref<1x8x128xf32, #tpu.memory_space<vmem>>, %arg11: memref<8x128xi32, #tpu.memory_space<vmem>>, %arg12: memref<256x128xf32, #tpu.memory_space<vmem>>, %arg13: memref<256x128xf32, #tpu.memory_space<vmem>>, %arg14: memref<1x256x128xbf16, #tpu.memory_space<vmem>>, %arg15: memref<1x256x128xbf16, #tpu.memory_space<vmem>>) attributes {dimension_semantics = [#tpu.dimension_semantics<arbitrary>, #tpu.dimension_semantics<arbitrary>, #tpu.dimension_semantics<arbitrary>], iteration_bounds = array<i64: 1, 2, 2>, scalar_prefetch = 2 : i64, scratch_operands = 0 : i64, tpu.core_type = #tpu.core_type<tc>, window_params = [{transform_indices = @transform_0, window_bounds = array<i64: 1, 128, 128>}, {transform_indices = @transform_1, window_bounds = array<i64: 1, 256, 128>}, {transform_indices = @transform_2, window_bounds = array<i64: 1, 256, 128>}, {transform_indices = @transform_3, window_bounds = array<i64: 1, 8, 128>}, {transform_indices = @transform_4, window_bounds = array<i64: 1, 128, 128>}, {transform_indices = @transform_5, window_bounds = array<i64: 1, 8, 128>}, {transform_indices = @transform_6, window_bounds = array<i64: 8, 128>}, {pipeline_mode = #tpu.pipeline_mode<synchronous>, transform_indices = @transform_7, window_bounds = array<i64: 256, 128>}, {pipeline_mode = #tpu.pipeline_mode<synchronous>, transform_indices = @transform_8, window_bounds = array<i64: 256, 128>}, {transform_indices = @transform_9, window_bounds = array<i64: 1, 256, 128>}, {transform_indices = @transform_10, window_bounds = array<i64: 1, 256, 128>}]} {
    %c0_i32 = arith.constant 0 : i32
    %0 = arith.cmpi eq, %arg2, %c0_i32 : i32
    %1 = arith.extui %0 : i1 to i32
    %c0_i32_0 = arith.constant 0 : i32
    %2 = arith.cmpi ne, %1, %c0_i32_0 : i32
    scf.if %2 {
      %cst = arith.constant 0.000000e+00 : f32
      %13 = vector.broadcast %cst : f32 to vector<256x128xf32>
      %c0_4 = arith.constant 0 : index
      %c0_5 = arith.constant 0 : index
      %14 = vector.load %arg12[%c0_4, %c0_5] : memref<256x128xf32, #tpu.memory_space<vmem>>, vector<256x128xf32>
      tpu.vector_store %arg12[%c0_4, %c0_5], %13 {strides = array<i32>} : memref<256x128xf32, #tpu.memory_space<vmem>>, vector<256x128xf32>, 
      %cst_6 = arith.constant 0.000000e+00 : f32
      %15 = vector.broadcast %cst_6 : f32 to vector<256x128xf32>
      %c0_7 = arith.constant 0 : index
      %c0_8 = arith.constant 0 : index
      %16 = vector.load %arg13[%c0_7, %c0_8] : memref<256x128xf32, #tpu.memory_space<vmem>>, vector<256x128xf32>
      tpu.vector_store %arg13[%c0_7, %c0_8], %15 {strides = array<i32>} : memref<256x128xf32, #tpu.memory_space<vmem>>, vector<256x128xf32>, 
    } else {
    }
    %c0 = arith.constant 0 : index
    %3 = arith.index_cast %arg2 : i32 to index
    %4 = arith.index_cast %arg0 : i32 to index
    %5 = memref.load %arg4[%c0, %3, %4] : memref<1x2x1xi8, #tpu.memory_space<smem>>
    %6 = arith.extsi %5 : i8 to i32
    %c0_i32_1 = arith.constant 0 : i32
    %7 = arith.cmpi sgt, %6, %c0_i32_1 : i32
    %8 = arith.extui %7 : i1 to i32
    %c0_i32_2 = arith.constant 0 : i32
    %9 = arith.cmpi ne, %8, %c0_i32_2 : i32
    scf.if %9 {
      %c0_i32_4 = arith.constant 0 : i32
      %c256_i32 = arith.constant 256 : i32
      %13 = arith.muli %c0_i32_4, %c256_i32 : i32
      %c0_5 = arith.constant 0 : index
      %c0_6 = arith.constant 0 : index
      %c0_7 = arith.constant 0 : index
      %14 = vector.load %arg5[%c0_5, %c0_6, %c0_7] : memref<1x128x128xbf16, #tpu.memory_space<vmem>>, vector<1x128x128xbf16>
      %15 = vector.shape_cast %14 : vector<1x128x128xbf16> to vector<128x128xbf16>
      %c0_8 = arith.constant 0 : index
      %16 = arith.index_cast %13 : i32 to index
      %c0_9 = arith.constant 0 : index
      %17 = vector.load %arg6[%c0_8, %16, %c0_9] : memref<1x256x128xbf16, #tpu.memory_space<vmem>>, vector<1x256x128xbf16>
      %18 = vector.shape_cast %17 : vector<1x256x128xbf16> to vector<256x128xbf16>
      %c0_10 = arith.constant 0 : index
      %19 = arith.index_cast %13 : i32 to index
      %c0_11 = arith.constant 0 : index
      %20 = vector.load %arg7[%c0_10, %19, %c0_11] : memref<1x256x128xbf16, #tpu.memory_space<vmem>>, vector<1x256x128xbf16>
      %21 = vector.shape_cast %20 : vector<1x256x128xbf16> to vector<256x128xbf16>
      %c0_12 = arith.constant 0 : index
      %c0_13 = arith.constant 0 : index
      %c0_14 = arith.constant 0 : index
      %22 = vector.load %arg8[%c0_12, %c0_13, %c0_14] : memref<1x8x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128xf32>
      %23 = vector.shape_cast %22 : vector<1x1x128xf32> to vector<1x128xf32>
      %c0_15 = arith.constant 0 : index
      %c0_16 = arith.constant 0 : index
      %c0_17 = arith.constant 0 : index
      %24 = vector.load %arg9[%c0_15, %c0_16, %c0_17] : memref<1x128x128xbf16, #tpu.memory_space<vmem>>, vector<1x128x128xbf16>
      %25 = vector.shape_cast %24 : vector<1x128x128xbf16> to vector<128x128xbf16>
      %c0_18 = arith.constant 0 : index
      %c0_19 = arith.constant 0 : index
      %c0_20 = arith.constant 0 : index
      %26 = vector.load %arg10[%c0_18, %c0_19, %c0_20] : memref<1x8x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128xf32>
      %27 = vector.shape_cast %26 : vector<1x1x128xf32> to vector<1x128xf32>
      %cst = arith.constant dense<0.000000e+00> : vector<256x128xf32>
      %28 = tpu.matmul %18, %15, %cst {dimension_numbers = #tpu.dot_dimension_numbers<[1], [1], [0], [0], [0, 0, 1, 0], [], []>, transpose_lhs_hint = false} : vector<256x128xbf16>, vector<128x128xbf16>, vector<256x128xf32> -> vector<256x128xf32>
      %c256_i32_21 = arith.constant 256 : i32
      %29 = arith.muli %arg0, %c256_i32_21 : i32
      %c256_i32_22 = arith.constant 256 : i32
      %30 = arith.muli %c0_i32_4, %c256_i32_22 : i32
      %31 = arith.addi %29, %30 : i32
      %32 = tpu.iota {dimensions = array<i32: 0>} : vector<256x128xi32>
      %33 = vector.broadcast %31 : i32 to vector<256x128xi32>
      %34 = arith.addi %33, %32 : vector<256x128xi32>
      %c0_23 = arith.constant 0 : index
      %c0_24 = arith.constant 0 : index
      %35 = vector.load %arg11[%c0_23, %c0_24] : memref<8x128xi32, #tpu.memory_space<vmem>>, vector<1x128xi32>
      %36 = vector.shape_cast %35 : vector<1x128xi32> to vector<1x128xi32>
      %37 = vector.broadcast %36 : vector<1x128xi32> to vector<256x128xi32>
      %38 = arith.cmpi sge, %37, %34 : vector<256x128xi32>
      %cst_25 = arith.constant -2.38197633E+38 : f32
      %39 = vector.broadcast %cst_25 : f32 to vector<256x128xf32>
      %40 = arith.select %38, %28, %39 : vector<256x128xi1>, vector<256x128xf32>
      %41 = vector.broadcast %23 : vector<1x128xf32> to vector<256x128xf32>
      %42 = arith.subf %40, %41 : vector<256x128xf32>
      %43 = math.exp %42 : vector<256x128xf32>
      %44 = arith.truncf %43 : vector<256x128xf32> to vector<256x128xbf16>
      %cst_26 = arith.constant dense<0.000000e+00> : vector<256x128xf32>
      %45 = tpu.matmul %44, %25, %cst_26 {dimension_numbers = #tpu.dot_dimension_numbers<[1], [0], [0], [1], [0, 0, 1, 1], [], []>, transpose_lhs_hint = false} : vector<256x128xbf16>, vector<128x128xbf16>, vector<256x128xf32> -> vector<256x128xf32>
      %46 = arith.index_cast %13 : i32 to index
      %c0_27 = arith.constant 0 : index
      %47 = vector.load %arg13[%46, %c0_27] : memref<256x128xf32, #tpu.memory_space<vmem>>, vector<256x128xf32>
      %48 = arith.addf %45, %47 : vector<256x128xf32>
      %49 = arith.index_cast %13 : i32 to index
      %c0_28 = arith.constant 0 : index
      %50 = vector.load %arg13[%49, %c0_28] : memref<256x128xf32, #tpu.memory_space<vmem>>, vector<256x128xf32>
      tpu.vector_store %arg13[%49, %c0_28], %48 {strides = array<i32>} : memref<256x128xf32, #tpu.memory_space<vmem>>, vector<256x128xf32>, 
      %cst_29 = arith.constant dense<0.000000e+00> : vector<256x128xf32>
      %51 = tpu.matmul %21, %25, %cst_29 {dimension_numbers = #tpu.dot_dimension_numbers<[1], [1], [0], [0], [0, 0, 1, 0], [], []>, transpose_lhs_hint = false} : vector<256x128xbf16>, vector<128x128xbf16>, vector<256x128xf32> -> vector<256x128xf32>
      %52 = vector.broadcast %27 : vector<1x128xf32> to vector<256x128xf32>
      %53 = arith.subf %51, %52 : vector<256x128xf32>
      %54 = arith.mulf %53, %43 : vector<256x128xf32>
      %55 = arith.truncf %54 : vector<256x128xf32> to vector<256x128xbf16>
      %cst_30 = arith.constant dense<0.000000e+00> : vector<256x128xf32>
      %56 = tpu.matmul %55, %15, %cst_30 {dimension_numbers = #tpu.dot_dimension_numbers<[1], [0], [0], [1], [0, 0, 1, 1], [], []>, transpose_lhs_hint = false} : vector<256x128xbf16>, vector<128x128xbf16>, vector<256x128xf32> -> vector<256x128xf32>
      %57 = arith.index_cast %13 : i32 to index
      %c0_31 = arith.constant 0 : index
      %58 = vector.load %arg12[%57, %c0_31] : memref<256x128xf32, #tpu.memory_space<vmem>>, vector<256x128xf32>
      %59 = arith.addf %56, %58 : vector<256x128xf32>
      %60 = arith.index_cast %13 : i32 to index
      %c0_32 = arith.constant 0 : index
      %61 = vector.load %arg12[%60, %c0_32] : memref<256x128xf32, #tpu.memory_space<vmem>>, vector<256x128xf32>
      tpu.vector_store %arg12[%60, %c0_32], %59 {strides = array<i32>} : memref<256x128xf32, #tpu.memory_space<vmem>>, vector<256x128xf32>, 
      %c1_i32_33 = arith.constant 1 : i32
    } else {
    }
    %c1_i32 = arith.constant 1 : i32
    %10 = arith.cmpi eq, %arg2, %c1_i32 : i32
    %11 = arith.extui %10 : i1 to i32
    %c0_i32_3 = arith.constant 0 : i32
    %12 = arith.cmpi ne, %11, %c0_i32_3 : i32
    scf.if %12 {
      %c0_4 = arith.constant 0 : index
      %c0_5 = arith.constant 0 : index
      %13 = vector.load %arg12[%c0_4, %c0_5] : memref<256x128xf32, #tpu.memory_space<vmem>>, vector<256x128xf32>
      %14 = arith.truncf %13 : vector<256x128xf32> to vector<256x128xbf16>
      %c0_6 = arith.constant 0 : index
      %c0_7 = arith.constant 0 : index
      %c0_8 = arith.constant 0 : index
      %15 = vector.load %arg14[%c0_6, %c0_7, %c0_8] : memref<1x256x128xbf16, #tpu.memory_space<vmem>>, vector<1x256x128xbf16>
      %16 = vector.shape_cast %15 : vector<1x256x128xbf16> to vector<256x128xbf16>
      %17 = vector.shape_cast %14 : vector<256x128xbf16> to vector<1x256x128xbf16>
      tpu.vector_store %arg14[%c0_6, %c0_7, %c0_8], %17 {strides = array<i32>} : memref<1x256x128xbf16, #tpu.memory_space<vmem>>, vector<1x256x128xbf16>, 
      %c0_9 = arith.constant 0 : index
      %c0_10 = arith.constant 0 : index
      %18 = vector.load %arg13[%c0_9, %c0_10] : memref<256x128xf32, #tpu.memory_space<vmem>>, vector<256x128xf32>
      %19 = arith.truncf %18 : vector<256x128xf32> to vector<256x128xbf16>
      %c0_11 = arith.constant 0 : index
      %c0_12 = arith.constant 0 : index
      %c0_13 = arith.constant 0 : index
      %20 = vector.load %arg15[%c0_11, %c0_12, %c0_13] : memref<1x256x128xbf16, #tpu.memory_space<vmem>>, vector<1x256x128xbf16>
      %21 = vector.shape_cast %20 : vector<1x256x128xbf16> to vector<256x128xbf16>
      %22 = vector.shape_cast %19 : vector<256x128xbf16> to vector<1x256x128xbf16>
      tpu.vector_store %arg15[%c0_11, %c0_12, %c0_13], %22 {strides = array<i32>} : memref<1x256x128xbf16, #tpu.memory_space<vmem>>, vector<1x256x128xbf16>, 
      %cst = arith.constant 0.000000e+00 : f32
      %23 = vector.broadcast %cst : f32 to vector<256x128xf32>
      %c0_14 = arith.constant 0 : index
      %c0_15 = arith.constant 0 : index
      %24 = vector.load %arg12[%c0_14, %c0_15] : memref<256x128xf32, #tpu.memory_space<vmem>>, vector<256x128xf32>
      tpu.vector_store %arg12[%c0_14, %c0_15], %23 {strides = array<i32>} : memref<256x128xf32, #tpu.memory_space<vmem>>, vector<256x128xf32>, 
      %cst_16 = arith.constant 0.000000e+00 : f32
      %25 = vector.broadcast %cst_16 : f32 to vector<256x128xf32>
      %c0_17 = arith.constant 0 : index
      %c0_18 = arith.constant 0 : index
      %26 = vector.load %arg13[%c0_17, %c0_18] : memref<256x128xf32, #tpu.memory_space<vmem>>, vector<256x128xf32>
      tpu.vector_store %arg13[%c0_17, %c0_18], %25 {strides = array<i32>} : memref<256x128xf32, #tpu.memory_space<vmem>>, vector<256x128xf32>, 
    } else {
    }
    return
  }
  func.func @transform_0(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>) -> (i32, i32, i32) {
    %c0 = arith.constant 0 : index
    %0 = arith.index_cast %arg2 : i32 to index
    %1 = arith.index_cast %arg0 : i32 to index
    %2 = memref.load %arg4[%c0, %0, %1] : memref<1x2x1xi8, #tpu.memory_space<smem>>
    %3 = arith.extsi %2 : i8 to i32
    %c0_i32 = arith.constant 0 : i32
    %4 = arith.cmpi sgt, %3, %c0_i32 : i32
    %c0_0 = arith.constant 0 : index
    %5 = arith.index_cast %arg2 : i32 to index
    %6 = arith.index_cast %arg0 : i32 to index
    %7 = memref.load %arg3[%c0_0, %5, %6] : memref<1x2x1xi8, #tpu.memory_space<smem>>
    %8 = arith.extsi %7 : i8 to i32
    %c0_i32_1 = arith.constant 0 : i32
    %c0_i32_2 = arith.constant 0 : i32
    return %arg1, %8, %c0_i32_1 : i32, i32, i32
  }
  func.func @transform_1(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>) -> (i32, i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    return %arg1, %arg0, %c0_i32 : i32, i32, i32
  }
  func.func @transform_2(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>) -> (i32, i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    return %arg1, %arg0, %c0_i32 : i32, i32, i32
  }
  func.func @transform_3(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>) -> (i32, i32, i32) {
    %c0 = arith.constant 0 : index
    %0 = arith.index_cast %arg2 : i32 to index
    %1 = arith.index_cast %arg0 : i32 to index
    %2 = memref.load %arg4[%c0, %0, %1] : memref<1x2x1xi8, #tpu.memory_space<smem>>
    %3 = arith.extsi %2 : i8 to i32
    %c0_i32 = arith.constant 0 : i32
    %4 = arith.cmpi sgt, %3, %c0_i32 : i32
    %c0_0 = arith.constant 0 : index
    %5 = arith.index_cast %arg2 : i32 to index
    %6 = arith.index_cast %arg0 : i32 to index
    %7 = memref.load %arg3[%c0_0, %5, %6] : memref<1x2x1xi8, #tpu.memory_space<smem>>
    %8 = arith.extsi %7 : i8 to i32
    %c0_i32_1 = arith.constant 0 : i32
    %c0_i32_2 = arith.constant 0 : i32
    return %arg1, %c0_i32_1, %8 : i32, i32, i32
  }
  func.func @transform_4(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>) -> (i32, i32, i32) {
    %c0 = arith.constant 0 : index
    %0 = arith.index_cast %arg2 : i32 to index
    %1 = arith.index_cast %arg0 : i32 to index
    %2 = memref.load %arg4[%c0, %0, %1] : memref<1x2x1xi8, #tpu.memory_space<smem>>
    %3 = arith.extsi %2 : i8 to i32
    %c0_i32 = arith.constant 0 : i32
    %4 = arith.cmpi sgt, %3, %c0_i32 : i32
    %c0_0 = arith.constant 0 : index
    %5 = arith.index_cast %arg2 : i32 to index
    %6 = arith.index_cast %arg0 : i32 to index
    %7 = memref.load %arg3[%c0_0, %5, %6] : memref<1x2x1xi8, #tpu.memory_space<smem>>
    %8 = arith.extsi %7 : i8 to i32
    %c0_i32_1 = arith.constant 0 : i32
    %c0_i32_2 = arith.constant 0 : i32
    return %arg1, %8, %c0_i32_1 : i32, i32, i32
  }
  func.func @transform_5(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>) -> (i32, i32, i32) {
    %c0 = arith.constant 0 : index
    %0 = arith.index_cast %arg2 : i32 to index
    %1 = arith.index_cast %arg0 : i32 to index
    %2 = memref.load %arg4[%c0, %0, %1] : memref<1x2x1xi8, #tpu.memory_space<smem>>
    %3 = arith.extsi %2 : i8 to i32
    %c0_i32 = arith.constant 0 : i32
    %4 = arith.cmpi sgt, %3, %c0_i32 : i32
    %c0_0 = arith.constant 0 : index
    %5 = arith.index_cast %arg2 : i32 to index
    %6 = arith.index_cast %arg0 : i32 to index
    %7 = memref.load %arg3[%c0_0, %5, %6] : memref<1x2x1xi8, #tpu.memory_space<smem>>
    %8 = arith.extsi %7 : i8 to i32
    %c0_i32_1 = arith.constant 0 : i32
    %c0_i32_2 = arith.constant 0 : i32
    return %arg1, %c0_i32_1, %8 : i32, i32, i32
  }
  func.func @transform_6(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>) -> (i32, i32) {
    %c0 = arith.constant 0 : index
    %0 = arith.index_cast %arg2 : i32 to index
    %1 = arith.index_cast %arg0 : i32 to index
    %2 = memref.load %arg4[%c0, %0, %1] : memref<1x2x1xi8, #tpu.memory_space<smem>>
    %3 = arith.extsi %2 : i8 to i32
    %c0_i32 = arith.constant 0 : i32
    %4 = arith.cmpi sgt, %3, %c0_i32 : i32
    %c0_0 = arith.constant 0 : index
    %5 = arith.index_cast %arg2 : i32 to index
    %6 = arith.index_cast %arg0 : i32 to index
    %7 = memref.load %arg3[%c0_0, %5, %6] : memref<1x2x1xi8, #tpu.memory_space<smem>>
    %8 = arith.extsi %7 : i8 to i32
    %c0_i32_1 = arith.constant 0 : i32
    %c0_i32_2 = arith.constant 0 : i32
    return %c0_i32_1, %8 : i32, i32
  }
  func.func @transform_7(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>) -> (i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    %c0_i32_1 = arith.constant 0 : i32
    return %c0_i32, %c0_i32_0 : i32, i32
  }
  func.func @transform_8(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>) -> (i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    %c0_i32_1 = arith.constant 0 : i32
    return %c0_i32, %c0_i32_0 : i32, i32
  }
  func.func @transform_9(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>) -> (i32, i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    return %arg1, %arg0, %c0_i32 : i32, i32, i32
  }
  func.func @transform_10(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>) -> (i32, i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    return %arg1, %arg0, %c0_i32 : i32, i32, i32
  }
}
