// mkkellogg GaussianSplats3D's own .ksplat code, run in node for lift3d's cross-tool tests:
//   node ksplat.mjs write IN.ply|IN.splat OUT.ksplat LEVEL SH_DEGREE   its writer (SplatBufferGenerator)
//   node ksplat.mjs read IN.ksplat OUT.json                             its reader (SplatBuffer): every Gaussian's
//                                                                       center, scale, rotation (wxyz) and rgba 0..255
import * as fs from 'fs';
import * as THREE from 'three';
import * as GS from '@mkkellogg/gaussian-splats-3d';

const [command, input, output, level = '0', degree = '0'] = process.argv.slice(2);
const data = fs.readFileSync(input);
const buffer = data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength);
if (command === 'write') {
    const array = input.toLowerCase().endsWith('.ply')
        ? GS.PlyParser.parseToUncompressedSplatArray(buffer, parseInt(degree))
        : GS.SplatParser.parseStandardSplatToUncompressedSplatArray(buffer);
    const generator = GS.SplatBufferGenerator.getStandardGenerator(0, parseInt(level), 0, undefined, undefined, undefined);
    fs.writeFileSync(output, Buffer.from(generator.generateFromUncompressedSplatArray(array).bufferData));
} else if (command === 'read') {
    const splats = new GS.SplatBuffer(buffer);
    const count = splats.getSplatCount();
    const out = { count, centers: [], scales: [], rotations: [], colors: [] };
    const center = new THREE.Vector3(), scale = new THREE.Vector3(), rotation = new THREE.Quaternion();
    const color = new THREE.Vector4();
    for (let i = 0; i < count; i++) {
        splats.getSplatCenter(i, center);
        splats.getSplatScaleAndRotation(i, scale, rotation);
        splats.getSplatColor(i, color);
        out.centers.push(center.toArray());
        out.scales.push(scale.toArray());
        out.rotations.push([rotation.w, rotation.x, rotation.y, rotation.z]);
        out.colors.push(color.toArray());
    }
    fs.writeFileSync(output, JSON.stringify(out));
} else {
    throw new Error(`unknown command ${command}: write or read`);
}
