//! What the driver's tests hand it: a class around a providerSpec, the static-key Secret, and
//! a valid providerSpec for scripted endpoints (nothing of it exists anywhere).

use mcm_api::MachineClass;
use mcm_driver::SecretData;
use serde_json::{Value, json};

/// The region of every test.
pub const REGION: &str = "eu-west-1";
/// The user data of [`secret`].
pub const USER_DATA: &str = "#!/bin/bash\necho booting\n";

/// A MachineClass `aws` with `spec`.
pub fn class(spec: Value) -> MachineClass {
    serde_json::from_value(json!({
        "metadata": { "name": "aws" },
        "provider": "AWS",
        "providerSpec": spec,
    }))
    .unwrap()
}

/// A Secret with a static access key and [`USER_DATA`].
pub fn secret() -> SecretData {
    SecretData::from_pairs([
        ("providerAccessKeyId", "AKIDTEST"),
        ("providerSecretAccessKey", "secret"),
        ("userData", USER_DATA),
    ])
}

/// A valid providerSpec whose AMI, subnet and security group exist nowhere: for endpoints
/// that answer from a script.
pub fn scripted_spec() -> Value {
    json!({
        "ami": "ami-1", "region": REGION, "machineType": "m5.large", "iam": { "name": "p" },
        "networkInterfaces": [{ "subnetID": "subnet-1", "securityGroupIDs": ["sg-1"] }],
        "tags": { "kubernetes.io/cluster/x": "1", "kubernetes.io/role/node": "1" },
    })
}
