//! The Azure driver against the fake ARM (`mcm-fake-arm`, providers/azure/fake, one server per
//! test), and against scripted answers the fake never gives.

use mcm_fake_arm as fake_arm;

use std::time::Duration;

use fake_arm::{FakeArm, HttpsServer, allocation_failed_message, sku_not_available_message};
use mcm_api::{Machine, MachineClass};
use mcm_driver::{
    Code, CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, Driver, DriverError,
    GetMachineStatusRequest, GetMachineStatusResponse, GetVolumeIdsRequest, IdempotencyKey,
    ListMachinesRequest, RequestId, ResourceKind, ResourceState, SecretData,
};
use mcm_provider_azure::{AzureDriver, AzureDriverConfig, CloudEndpoints};
use serde_json::{Value, json};

const SUB: &str = "00000000-0000-0000-0000-00000000000a";
const TENANT: &str = "00000000-0000-0000-0000-00000000000b";
const CLIENT: &str = "00000000-0000-0000-0000-00000000000c";
const SECRET: &str = "s3cret";
const RG: &str = "shoot--test";
const CLUSTER_TAG: &str = "kubernetes.io-cluster-shoot--test";
const ROLE_TAG: &str = "kubernetes.io-role-node";
const USER_DATA: &str = "#cloud-config\nbootstrap: token\n";

async fn fake() -> FakeArm {
    let f = FakeArm::start(SUB, TENANT, CLIENT, SECRET).await;
    f.add_subnet(RG, "shoot--test", "shoot--test-nodes");
    f
}

fn config(fake: &FakeArm) -> AzureDriverConfig {
    AzureDriverConfig {
        arm_endpoint: Some(fake.url()),
        authority_host: Some(fake.url()),
        operation_timeout: Duration::from_secs(20),
        poll_interval: Duration::from_millis(50),
        max_poll_interval: Duration::from_millis(200),
        extra_ca_pem: Some(fake.ca_pem().to_string()),
        ..AzureDriverConfig::default()
    }
}

fn driver(fake: &FakeArm) -> AzureDriver {
    AzureDriver::new(config(fake))
}

fn spec() -> Value {
    json!({
        "location": "westeurope",
        "resourceGroup": RG,
        "subnetInfo": {"vnetName": "shoot--test", "subnetName": "shoot--test-nodes"},
        "tags": {"Name": "shoot--test", CLUSTER_TAG: "1", ROLE_TAG: "1"},
        "properties": {
            "hardwareProfile": {"vmSize": "Standard_D2s_v5"},
            "storageProfile": {
                "imageReference": {"urn": "sap:gardenlinux:greatest:1443.3.0", "skipMarketplaceAgreement": true},
                "osDisk": {"caching": "None", "diskSizeGB": 50, "createOption": "FromImage",
                           "managedDisk": {"storageAccountType": "Premium_LRS"}},
                "dataDisks": [{"name": "data", "lun": 0, "storageAccountType": "StandardSSD_LRS", "diskSizeGB": 10}]
            },
            "osProfile": {"adminUsername": "core", "linuxConfiguration": {
                "disablePasswordAuthentication": true,
                "ssh": {"publicKeys": {"path": "/home/core/.ssh/authorized_keys", "keyData": "ssh-rsa AAAAB3NzaC1yc2E test"}}}},
            "zone": 1
        }
    })
}

fn class(spec: Value) -> MachineClass {
    serde_json::from_value(json!({
        "metadata": { "name": "azure" },
        "provider": "Azure",
        "providerSpec": spec,
    }))
    .unwrap()
}

fn secret_with(client_secret: &str) -> SecretData {
    SecretData::from_pairs([
        ("clientID", CLIENT),
        ("clientSecret", client_secret),
        ("tenantID", TENANT),
        ("subscriptionID", SUB),
        ("userData", USER_DATA),
    ])
}

fn secret() -> SecretData {
    secret_with(SECRET)
}

fn machine(name: &str) -> Machine {
    Machine::new(name, Default::default())
}

async fn create_with(
    d: &AzureDriver,
    c: &MachineClass,
    name: &str,
    request_id: RequestId,
) -> Result<CreateMachineResponse, DriverError> {
    d.create_machine(CreateMachineRequest {
        machine: machine(name),
        machine_class: c.clone(),
        secret: secret(),
        request_id,
        idempotency_key: IdempotencyKey::random(),
    })
    .await
}

async fn create(
    d: &AzureDriver,
    c: &MachineClass,
    name: &str,
) -> Result<CreateMachineResponse, DriverError> {
    create_with(d, c, name, RequestId::generate()).await
}

async fn status(
    d: &AzureDriver,
    c: &MachineClass,
    name: &str,
) -> Result<GetMachineStatusResponse, DriverError> {
    d.get_machine_status(GetMachineStatusRequest {
        machine: machine(name),
        machine_class: c.clone(),
        secret: secret(),
        request_id: RequestId::generate(),
    })
    .await
}

/// [`status`] of a machine that was created (it has its providerID).
async fn status_of_created(
    d: &AzureDriver,
    c: &MachineClass,
    name: &str,
) -> Result<GetMachineStatusResponse, DriverError> {
    let mut m = machine(name);
    m.spec.provider_id = Some(format!("azure:///westeurope/{name}"));
    d.get_machine_status(GetMachineStatusRequest {
        machine: m,
        machine_class: c.clone(),
        secret: secret(),
        request_id: RequestId::generate(),
    })
    .await
}

async fn delete(d: &AzureDriver, c: &MachineClass, name: &str) -> Result<(), DriverError> {
    d.delete_machine(DeleteMachineRequest {
        machine: machine(name),
        machine_class: c.clone(),
        secret: secret(),
        request_id: RequestId::generate(),
    })
    .await
    .map(drop)
}

async fn list(d: &AzureDriver, c: &MachineClass) -> Vec<(String, String)> {
    d.list_machines(ListMachinesRequest {
        machine_class: c.clone(),
        secret: secret(),
        request_id: RequestId::generate(),
    })
    .await
    .unwrap()
    .machines
    .into_iter()
    .collect()
}

fn names(resources: Vec<Value>) -> Vec<String> {
    resources
        .iter()
        .map(|r| r["name"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn nothing_left(fake: &FakeArm) -> bool {
    fake.vms(RG).is_empty() && fake.nics(RG).is_empty() && fake.disks(RG).is_empty()
}

/// A driver whose public cloud is the fake `public` and whose cloud `name` is the fake
/// `other`, trusting both fakes' CAs, without the environment's overrides: the class's cloud
/// decides where its requests go.
fn two_cloud_driver(public: &FakeArm, name: &str, other: &FakeArm) -> AzureDriver {
    let mut clouds = CloudEndpoints::known();
    for (name, f) in [("AzurePublic", public), (name, other)] {
        clouds.insert(
            name.to_string(),
            CloudEndpoints {
                arm: f.url(),
                authority: f.url(),
            },
        );
    }
    AzureDriver::new(AzureDriverConfig {
        arm_endpoint: None,
        authority_host: None,
        clouds,
        extra_ca_pem: Some(format!("{}{}", public.ca_pem(), other.ca_pem())),
        ..config(public)
    })
}

#[tokio::test]
async fn each_cloud_is_served_by_its_own_endpoints() {
    let public = fake().await;
    let china = fake().await;
    let d = two_cloud_driver(&public, "AzureChina", &china);
    // No cloudConfiguration: public Azure.
    create(&d, &class(spec()), "m-pub").await.unwrap();
    // AzureChina: China's ARM and authority, a token for China's ARM (not the public one's,
    // although the service principal's tenant and id are the same).
    let mut cn = spec();
    cn["cloudConfiguration"] = json!({"name": "AzureChina"});
    cn["location"] = json!("chinanorth3");
    create(&d, &class(cn), "m-cn").await.unwrap();
    assert_eq!(names(public.vms(RG)), vec!["m-pub"]);
    assert_eq!(names(china.vms(RG)), vec!["m-cn"]);
    let scopes = |f: &FakeArm| -> Vec<String> {
        f.request_log()
            .iter()
            .filter(|r| r.is_token_request())
            .map(|r| {
                r.body.as_ref().unwrap()["scope"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    assert_eq!(scopes(&china), vec![format!("{}/.default", china.url())]);
    assert_eq!(scopes(&public), vec![format!("{}/.default", public.url())]);
    assert!(
        public
            .request_log()
            .iter()
            .all(|r| !r.path.contains("m-cn")),
        "nothing of the China machine went to the public cloud"
    );
}

#[tokio::test]
async fn a_created_vm_that_failed_an_operation_but_runs_exists() {
    let fake = fake().await;
    let d = driver(&fake);
    let c = class(spec());
    create(&d, &c, "m-0").await.unwrap();
    assert!(fake.fail_vm_directly(
        RG,
        "m-0",
        "VMExtensionProvisioningError",
        "VM has reported a failure when processing extension 'node-agent'."
    ));
    let vm_of = |s: &GetMachineStatusResponse| {
        s.resources
            .iter()
            .find(|r| r.kind == ResourceKind::Vm)
            .cloned()
            .unwrap()
    };

    // The machine has its providerID: the VM is there and runs (its pods with it).
    let s = status_of_created(&d, &c, "m-0").await.unwrap();
    let vm = vm_of(&s);
    assert_eq!(vm.state, ResourceState::Running, "{vm:?}");
    let message = vm.message.unwrap();
    assert!(
        message.contains("VMExtensionProvisioningError") && message.contains("power state running"),
        "{message}"
    );
    assert_eq!(s.provider_id, "azure:///westeurope/m-0");

    // Stopped as well: the machine's VM is not coming back by itself.
    assert!(fake.set_vm_power_state(RG, "m-0", "deallocated"));
    let vm = vm_of(&status_of_created(&d, &c, "m-0").await.unwrap());
    assert_eq!(vm.state, ResourceState::Stopped, "{vm:?}");

    // Before the machine has its providerID, a Failed VM is one a create left: NotFound, so
    // that creating it again repairs it.
    let e = status(&d, &c, "m-0").await.unwrap_err();
    assert_eq!(e.code, Code::NotFound, "{e}");
}

#[tokio::test]
async fn a_marketplace_image_with_a_plan_gets_its_plan_and_accepted_terms() {
    let fake = fake().await;
    let d = driver(&fake);
    fake.add_vm_image(
        "westeurope",
        "sap:gardenlinux:greatest:1443.3.0",
        Some(("greatest", "gardenlinux", "sap")),
    );
    let mut s = spec();
    s["properties"]["storageProfile"]["imageReference"] =
        json!({"urn": "sap:gardenlinux:greatest:1443.3.0"});
    let c = class(s.clone());
    assert!(!fake.agreement_accepted("greatest", "gardenlinux", "sap"));

    create(&d, &c, "m-0").await.unwrap();
    let vm = fake.vm(RG, "m-0").unwrap();
    assert_eq!(
        vm["plan"],
        json!({"name": "greatest", "product": "gardenlinux", "publisher": "sap"})
    );
    assert!(fake.agreement_accepted("greatest", "gardenlinux", "sap"));
    // Accepted once: the next machine reads the terms and sends the plan, nothing more.
    create(&d, &c, "m-1").await.unwrap();
    let terms_puts = fake
        .request_log()
        .iter()
        .filter(|r| r.method == "PUT" && r.path.ends_with("/agreements/current"))
        .count();
    assert_eq!(terms_puts, 1);

    // skipMarketPlaceAgreement (the extension's spelling): no lookup and no plan, as
    // Gardener's provider does; Compute then refuses the image that needs one.
    s["properties"]["storageProfile"]["imageReference"] =
        json!({"urn": "sap:gardenlinux:greatest:1443.3.0", "skipMarketPlaceAgreement": true});
    let e = create(&d, &class(s.clone()), "m-2").await.unwrap_err();
    assert!(e.message.contains("VMMarketplaceInvalidInput"), "{e}");

    // An image that does not exist is the class's mistake.
    s["properties"]["storageProfile"]["imageReference"] =
        json!({"urn": "sap:gardenlinux:greatest:0.0.0"});
    let e = create(&d, &class(s), "m-3").await.unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument, "{e}");
    assert!(e.message.contains("sap:gardenlinux:greatest:0.0.0"), "{e}");
}

#[tokio::test]
async fn data_disks_from_images_are_made_first_and_attached() {
    let fake = fake().await;
    let d = driver(&fake);
    fake.add_vm_image("westeurope", "sap:data:disk:1.0.0", None);
    let gallery = "/CommunityGalleries/gardenlinux-13e998fe/Images/data/Versions/1.0.0";
    let mut s = spec();
    s["properties"]["storageProfile"]["dataDisks"] = json!([
        {"name": "data", "lun": 0, "storageAccountType": "StandardSSD_LRS", "diskSizeGB": 10},
        {"name": "gallery", "lun": 1, "storageAccountType": "Premium_LRS", "diskSizeGB": 64,
         "imageRef": {"communityGalleryImageID": gallery}},
        {"name": "urn", "lun": 2, "storageAccountType": "Premium_LRS", "diskSizeGB": 32,
         "caching": "ReadOnly", "imageRef": {"urn": "sap:data:disk:1.0.0"}},
    ]);
    let c = class(s);
    create(&d, &c, "m-0").await.unwrap();

    let disk = fake
        .disk(RG, "m-0-gallery-1-data-disk")
        .expect("made from its image");
    assert_eq!(
        disk["properties"]["creationData"]["galleryImageReference"]["communityGalleryImageId"],
        gallery
    );
    assert_eq!(disk["zones"], json!(["1"]));
    assert_eq!(disk["tags"][CLUSTER_TAG], "1");
    let disk = fake
        .disk(RG, "m-0-urn-2-data-disk")
        .expect("made from its image");
    let image_id = disk["properties"]["creationData"]["imageReference"]["id"]
        .as_str()
        .unwrap()
        .to_ascii_lowercase();
    assert!(
        image_id.ends_with(
            "/publishers/sap/artifacttypes/vmimage/offers/data/skus/disk/versions/1.0.0"
        ),
        "{image_id}"
    );
    let vm = fake.vm(RG, "m-0").unwrap();
    let data = &vm["properties"]["storageProfile"]["dataDisks"];
    assert_eq!(data[0]["createOption"], "Empty");
    for (i, name) in [(1, "m-0-gallery-1-data-disk"), (2, "m-0-urn-2-data-disk")] {
        assert_eq!(data[i]["createOption"], "Attach", "{data}");
        assert_eq!(
            data[i]["managedDisk"]["id"]
                .as_str()
                .unwrap()
                .to_ascii_lowercase(),
            fake.disk_id(RG, name).to_ascii_lowercase()
        );
    }
    // A second create finds everything made: no disk is made twice.
    create(&d, &c, "m-0").await.unwrap();
    let disk_puts = fake
        .request_log()
        .iter()
        .filter(|r| r.method == "PUT" && r.path.contains("/disks/"))
        .count();
    assert_eq!(disk_puts, 2);
    // Deleting the machine deletes them with the VM.
    delete(&d, &c, "m-0").await.unwrap();
    assert!(nothing_left(&fake), "{:?}", names(fake.disks(RG)));
}

#[tokio::test]
async fn workload_identity_sends_the_federated_token_and_follows_its_refresh() {
    let fake = fake().await;
    // Tokens that live less than azure_identity's 300 s refresh margin: every call asks for a
    // new one, and so reads the file again.
    fake.set_token_lifetime(Duration::from_secs(120));
    let d = driver(&fake);
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "eyJ.first.token\n").unwrap();
    fake.trust_federated_token("eyJ.first.token");
    let path = token_file.display().to_string();
    let wi_secret = SecretData::from_pairs([
        ("clientID", CLIENT),
        ("tenantID", TENANT),
        ("subscriptionID", SUB),
        ("workloadIdentityTokenFile", path.as_str()),
        ("userData", USER_DATA),
    ]);
    let create_wi = |name: &'static str| {
        d.create_machine(CreateMachineRequest {
            machine: machine(name),
            machine_class: class(spec()),
            secret: wi_secret.clone(),
            request_id: RequestId::generate(),
            idempotency_key: IdempotencyKey::random(),
        })
    };
    create_wi("m-0").await.unwrap();
    let assertions = |f: &FakeArm| -> Vec<(Option<String>, Option<String>)> {
        f.request_log()
            .iter()
            .filter(|r| r.is_token_request())
            .map(|r| {
                let body = r.body.as_ref().unwrap();
                let field = |k: &str| body[k].as_str().map(String::from);
                (field("client_assertion"), field("client_secret"))
            })
            .collect()
    };
    let sent = assertions(&fake);
    assert!(
        !sent.is_empty()
            && sent
                .iter()
                .all(|a| *a == (Some("eyJ.first.token".into()), None)),
        "the federated token (trimmed), no client secret: {sent:?}"
    );

    // The token is refreshed in its file: the next token request presents the new one.
    std::fs::write(&token_file, "eyJ.second.token").unwrap();
    fake.trust_federated_token("eyJ.second.token");
    create_wi("m-1").await.unwrap();
    assert_eq!(
        assertions(&fake).last().cloned(),
        Some((Some("eyJ.second.token".into()), None))
    );

    // A token the application does not trust is refused by Entra ID; a missing file is
    // named.
    std::fs::write(&token_file, "eyJ.untrusted").unwrap();
    let e = create_wi("m-2").await.unwrap_err();
    assert_eq!(e.code, Code::Unauthenticated, "{e}");
    std::fs::remove_file(&token_file).unwrap();
    let e = create_wi("m-3").await.unwrap_err();
    assert_eq!(e.code, Code::Unauthenticated, "{e}");
    assert!(e.message.contains(&path), "{e}");
}

/// The Secret of workload identity with the token file `path`.
fn workload_identity_secret(path: &str) -> SecretData {
    SecretData::from_pairs([
        ("clientID", CLIENT),
        ("tenantID", TENANT),
        ("subscriptionID", SUB),
        ("workloadIdentityTokenFile", path),
        ("userData", USER_DATA),
    ])
}

/// The token requests the fake received: (path, scope, client_assertion).
fn token_requests(f: &FakeArm) -> Vec<(String, String, Option<String>)> {
    f.request_log()
        .into_iter()
        .filter(|r| r.is_token_request())
        .map(|r| {
            let body = r.body.unwrap_or_default();
            let field = |k: &str| body[k].as_str().map(String::from);
            (
                r.path,
                field("scope").unwrap_or_default(),
                field("client_assertion"),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_workload_identity_token_serves_every_call_and_its_refresh_reads_the_file_again() {
    let fake = fake().await;
    let d = driver(&fake);
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    let path = token_file.display().to_string();
    fake.trust_federated_token("eyJ.one");
    fake.trust_federated_token("eyJ.two");
    let list_wi = || {
        d.list_machines(ListMachinesRequest {
            machine_class: class(spec()),
            secret: workload_identity_secret(&path),
            request_id: RequestId::generate(),
        })
    };
    let assertions = |f: &FakeArm| -> Vec<Option<String>> {
        token_requests(f).into_iter().map(|(_, _, a)| a).collect()
    };
    std::fs::write(&token_file, "eyJ.one").unwrap();
    for _ in 0..3 {
        list_wi().await.unwrap();
    }
    assert_eq!(
        assertions(&fake),
        vec![Some("eyJ.one".to_string())],
        "one token (Entra ID's hour) serves every call"
    );
    // Tokens that live less than azure_identity's 300 s refresh margin: the same driver's
    // credential asks for a new one on each call, and reads the file gardenlet rewrote.
    fake.set_token_lifetime(Duration::from_secs(120));
    let d2 = driver(&fake);
    list_wi_with(&d2, &path).await;
    let before = assertions(&fake).len();
    std::fs::write(&token_file, "eyJ.two").unwrap();
    list_wi_with(&d2, &path).await;
    let sent = assertions(&fake);
    assert!(
        sent[1..before]
            .iter()
            .all(|a| a.as_deref() == Some("eyJ.one"))
            && sent.len() > before
            && sent[before..]
                .iter()
                .all(|a| a.as_deref() == Some("eyJ.two")),
        "each refresh reads the file (rewritten after request {before}): {sent:?}"
    );
}

/// `list_machines` of `d` with the workload identity of the token file `path`.
async fn list_wi_with(d: &AzureDriver, path: &str) {
    d.list_machines(ListMachinesRequest {
        machine_class: class(spec()),
        secret: workload_identity_secret(path),
        request_id: RequestId::generate(),
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn the_token_endpoint_is_https_and_only_the_drivers_client_trusts_the_fakes_ca() {
    let fake = fake().await;
    assert!(
        fake.url().starts_with("https://127.0.0.1:"),
        "{}",
        fake.url()
    );
    let c = class(spec());
    // A driver without the fake's CA: the platform's roots do not have it, so the token
    // request fails its TLS handshake and nothing reaches the fake.
    let untrusting = AzureDriver::new(AzureDriverConfig {
        extra_ca_pem: None,
        ..config(&fake)
    });
    let e = status(&untrusting, &c, "m-0").await.unwrap_err();
    assert_eq!(e.code, Code::Unauthenticated, "{e}");
    assert!(e.message.contains("(token) failed"), "{e}");
    let full = e.full_message();
    assert!(full.contains("certificate"), "{full}");
    assert!(
        fake.wait_for_failed_tls_handshakes(1, Duration::from_secs(10))
            .await
    );
    assert!(fake.request_log().is_empty(), "{:?}", fake.request_log());

    // The driver with it: the token request goes over TLS to the tenant's token path.
    let d = driver(&fake);
    create(&d, &c, "m-0").await.unwrap();
    let tokens = token_requests(&fake);
    assert_eq!(
        tokens
            .iter()
            .map(|(path, scope, _)| (path.as_str(), scope.as_str()))
            .collect::<Vec<_>>(),
        vec![(
            format!("/{TENANT}/oauth2/v2.0/token").as_str(),
            format!("{}/.default", fake.url()).as_str()
        )]
    );
    assert_eq!(fake.token_url(), format!("{}{}", fake.url(), tokens[0].0));

    // Trusting the CA in one driver's client changed nothing for another's.
    let failed = fake.failed_tls_handshakes();
    let e = status(&untrusting, &c, "m-0").await.unwrap_err();
    assert_eq!(e.code, Code::Unauthenticated, "{e}");
    assert!(
        fake.wait_for_failed_tls_handshakes(failed + 1, Duration::from_secs(10))
            .await
    );
}

#[tokio::test]
async fn a_sovereign_cloud_asks_its_own_authority_host() {
    let public = fake().await;
    let government = fake().await;
    // No AZURE_AUTHORITY_HOST / MCM_AZURE_ARM_ENDPOINT: the class's cloud decides.
    let d = two_cloud_driver(&public, "AzureGovernment", &government);
    let mut gov = spec();
    gov["cloudConfiguration"] = json!({"name": "AzureGovernment"});
    gov["location"] = json!("usgovvirginia");
    create(&d, &class(gov), "m-gov").await.unwrap();
    assert_eq!(
        token_requests(&government)
            .into_iter()
            .map(|(path, scope, _)| (path, scope))
            .collect::<Vec<_>>(),
        vec![(
            format!("/{TENANT}/oauth2/v2.0/token"),
            format!("{}/.default", government.url())
        )]
    );
    assert_eq!(names(government.vms(RG)), vec!["m-gov"]);
    assert!(
        public.request_log().is_empty(),
        "public Azure was asked nothing: {:?}",
        public.request_log()
    );
}

#[tokio::test]
async fn a_refused_client_secret_is_a_clear_unauthenticated_error() {
    let fake = fake().await;
    let d = driver(&fake);
    let c = class(spec());
    let status_with = |secret: SecretData| {
        d.get_machine_status(GetMachineStatusRequest {
            machine: machine("m-0"),
            machine_class: c.clone(),
            secret,
            request_id: RequestId::generate(),
        })
    };
    let e = status_with(secret_with("not-the-secret"))
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::Unauthenticated, "{e}");
    assert_eq!(e.retry_after, None, "{e}");
    for part in [
        "GET virtualMachines m-0 (token) failed (CredentialUnavailable)",
        "ClientSecretCredential authentication failed",
        "AADSTS7000215: Invalid client secret provided",
        "request id",
    ] {
        assert!(e.message.contains(part), "{part:?} in {e}");
    }
    assert!(!e.full_message().contains("not-the-secret"), "{e}");
    // Entra ID answered 401 to the token request; ARM was never asked.
    let log = fake.request_log();
    assert_eq!(
        log.iter()
            .map(|r| (r.is_token_request(), r.status))
            .collect::<Vec<_>>(),
        vec![(true, 401)]
    );

    // An application the tenant does not know.
    let mut unknown = secret();
    unknown.0.insert(
        "clientID".into(),
        b"00000000-0000-0000-0000-0000000000ff".to_vec(),
    );
    let e = status_with(unknown).await.unwrap_err();
    assert_eq!(e.code, Code::Unauthenticated, "{e}");
    assert!(e.message.contains("AADSTS700016"), "{e}");
}

#[tokio::test]
async fn create_status_list_delete() {
    let fake = fake().await;
    let d = driver(&fake);
    let c = class(spec());
    let id = RequestId::generate();
    let created = create_with(&d, &c, "m-0", id.clone()).await.unwrap();
    assert_eq!(created.provider_id, "azure:///westeurope/m-0");
    assert_eq!(created.node_name, "m-0");
    assert!(
        created.addresses.iter().any(|a| a.type_ == "InternalIP"),
        "{:?}",
        created.addresses
    );
    // NIC, VM and its disks, named after the machine; the VM carries the user data.
    assert_eq!(names(fake.nics(RG)), vec!["m-0-nic"]);
    assert_eq!(names(fake.vms(RG)), vec!["m-0"]);
    let mut disks = names(fake.disks(RG));
    disks.sort();
    assert_eq!(disks, vec!["m-0-data-0-data-disk", "m-0-os-disk"]);
    let vm = fake.vm(RG, "m-0").unwrap();
    assert_eq!(vm["properties"]["provisioningState"], "Succeeded");
    assert_eq!(vm["tags"][CLUSTER_TAG], "1");
    // Every ARM request of the call carried its request id.
    let arm: Vec<_> = fake
        .request_log()
        .into_iter()
        .filter(|r| !r.is_token_request())
        .collect();
    assert!(!arm.is_empty());
    for r in &arm {
        assert_eq!(
            r.header("x-ms-client-request-id"),
            Some(id.as_str()),
            "{} {}",
            r.method,
            r.path
        );
    }

    let s = status(&d, &c, "m-0").await.unwrap();
    assert_eq!(s.provider_id, created.provider_id);
    let kinds: Vec<(ResourceKind, ResourceState)> = s
        .resources
        .iter()
        .map(|r| (r.kind.clone(), r.state))
        .collect();
    assert_eq!(kinds[0], (ResourceKind::Vm, ResourceState::Running));
    assert_eq!(
        kinds[1],
        (ResourceKind::NetworkInterface, ResourceState::Running)
    );
    assert!(kinds.iter().any(|k| k.0 == ResourceKind::Disk));

    assert_eq!(
        list(&d, &c).await,
        vec![("azure:///westeurope/m-0".to_string(), "m-0".to_string())]
    );

    delete(&d, &c, "m-0").await.unwrap();
    assert!(
        nothing_left(&fake),
        "vms {:?} nics {:?} disks {:?}",
        fake.vms(RG),
        fake.nics(RG),
        fake.disks(RG)
    );
    assert_eq!(
        status(&d, &c, "m-0").await.unwrap_err().code,
        Code::NotFound
    );
    delete(&d, &c, "m-0").await.unwrap();
}

#[tokio::test]
async fn create_is_idempotent() {
    let fake = fake().await;
    let d = driver(&fake);
    let c = class(spec());
    let first = create(&d, &c, "m-1").await.unwrap();
    let again = create(&d, &c, "m-1").await.unwrap();
    assert_eq!(again.provider_id, first.provider_id);
    assert_eq!(fake.creates_of("m-1"), 1);
    assert_eq!(fake.nic_creates_of("m-1-nic"), 1);
}

#[tokio::test]
async fn capacity_failures_are_resource_exhausted_and_leave_nothing() {
    let fake = fake().await;
    let d = driver(&fake);
    let c = class(spec());
    fake.fail_next_vm_creates(1, "AllocationFailed", &allocation_failed_message());
    let e = create(&d, &c, "m-2").await.unwrap_err();
    assert_eq!(e.code, Code::ResourceExhausted, "{e}");
    assert!(e.message.contains("AllocationFailed"), "{e}");
    assert!(e.message.contains("request id"), "{e}");
    assert!(
        nothing_left(&fake),
        "vms {:?} nics {:?}",
        names(fake.vms(RG)),
        names(fake.nics(RG))
    );

    fake.reject_next_vm_creates(
        1,
        409,
        "SkuNotAvailable",
        &sku_not_available_message("Standard_D2s_v5", "westeurope"),
    );
    let e = create(&d, &c, "m-2").await.unwrap_err();
    assert_eq!(e.code, Code::ResourceExhausted, "{e}");
    assert!(
        e.message.contains("x-ms-request-id"),
        "names ARM's request id: {e}"
    );
    assert!(nothing_left(&fake));
    create(&d, &c, "m-2").await.unwrap();
}

#[tokio::test]
async fn a_half_made_machine_is_visible_and_deleted_completely() {
    let fake = fake().await;
    let d = driver(&fake);
    let c = class(spec());
    // The VM's operation fails for a reason that is not capacity: the NIC exists, the VM is
    // left Failed (as Azure leaves it) and says so.
    fake.fail_next_vm_creates(
        1,
        "InternalExecutionError",
        "An internal execution error occurred.",
    );
    let e = create(&d, &c, "m-3").await.unwrap_err();
    assert_eq!(e.code, Code::Internal, "{e}");
    assert_eq!(
        fake.vm(RG, "m-3").unwrap()["properties"]["provisioningState"],
        "Failed"
    );
    // The status says there is no machine to wait for, so the controller creates it again,
    // which repairs the failed VM in place.
    let e = status(&d, &c, "m-3").await.unwrap_err();
    assert_eq!(e.code, Code::NotFound, "{e}");
    assert!(e.message.contains("provisioningState Failed"), "{e}");
    create(&d, &c, "m-3").await.unwrap();
    assert_eq!(
        status(&d, &c, "m-3").await.unwrap().resources[0].state,
        ResourceState::Running
    );
    assert_eq!(
        fake.creates_of("m-3"),
        1,
        "repaired in place, not made twice"
    );
    // A failed VM is deleted completely too: the VM, the NIC it still uses, and the disks.
    fake.fail_next_vm_creates(
        1,
        "InternalExecutionError",
        "An internal execution error occurred.",
    );
    create(&d, &c, "m-3b").await.unwrap_err();
    delete(&d, &c, "m-3b").await.unwrap();
    delete(&d, &c, "m-3").await.unwrap();
    assert!(
        nothing_left(&fake),
        "vms {:?} nics {:?} disks {:?}",
        names(fake.vms(RG)),
        names(fake.nics(RG)),
        names(fake.disks(RG))
    );

    // A NIC whose VM never came: deleted without a VM.
    fake.reject_next_vm_creates(
        1,
        400,
        "InvalidParameter",
        "The value of parameter imageReference is invalid.",
    );
    let e = create(&d, &c, "m-4").await.unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument, "{e}");
    assert_eq!(names(fake.nics(RG)), vec!["m-4-nic"]);
    delete(&d, &c, "m-4").await.unwrap();
    assert!(nothing_left(&fake));
}

#[tokio::test]
async fn orphan_nics_are_listed_as_their_machine_and_another_clusters_vm_is_left_alone() {
    let fake = fake().await;
    let d = driver(&fake);
    fake.set_page_size(2);
    let c = class(spec());
    for i in 0..3 {
        create(&d, &c, &format!("m-{i}")).await.unwrap();
    }
    let subnet = fake.subnet_id(RG, "shoot--test", "shoot--test-nodes");
    fake.put_nic_directly(
        RG,
        json!({"name": "gone-nic", "location": "westeurope", "tags": {CLUSTER_TAG: "1", ROLE_TAG: "1"},
               "properties": {"ipConfigurations": [{"name": "ip", "properties": {"subnet": {"id": subnet}}}]}}),
    );
    fake.put_nic_directly(
        RG,
        json!({"name": "other-nic", "location": "westeurope", "tags": {"kubernetes.io-cluster-other": "1", ROLE_TAG: "1"},
               "properties": {"ipConfigurations": [{"name": "ip", "properties": {"subnet": {"id": subnet}}}]}}),
    );
    let got = list(&d, &c).await;
    let machines: Vec<&str> = got.iter().map(|(_, m)| m.as_str()).collect();
    assert_eq!(machines, vec!["gone", "m-0", "m-1", "m-2"]);
    let pages = fake
        .request_log()
        .iter()
        .filter(|r| r.method == "GET" && r.path.ends_with("/networkInterfaces"))
        .count();
    assert!(pages >= 3, "5 NICs at 2 per page: {pages}");
    // The orphan collector deletes "gone": its NIC goes.
    delete(&d, &c, "gone").await.unwrap();
    assert!(fake.nic(RG, "gone-nic").is_none());
    assert!(fake.nic(RG, "other-nic").is_some());

    // A VM of another cluster in the same group is neither read as ours nor deleted.
    let mut other = spec();
    other["tags"] = json!({"kubernetes.io-cluster-other": "1", ROLE_TAG: "1"});
    create(&d, &class(other), "foreign").await.unwrap();
    assert_eq!(
        status(&d, &c, "foreign").await.unwrap_err().code,
        Code::NotFound
    );
    assert_eq!(
        delete(&d, &c, "foreign").await.unwrap_err().code,
        Code::NotFound
    );
    assert!(fake.vm(RG, "foreign").is_some());
}

#[tokio::test]
async fn throttling_and_bad_input() {
    let fake = fake().await;
    let d = driver(&fake);
    let c = class(spec());
    create(&d, &c, "m-5").await.unwrap();
    fake.throttle_next(1, 7);
    let e = status(&d, &c, "m-5").await.unwrap_err();
    assert_eq!(
        (e.code, e.retry_after),
        (Code::Unavailable, Some(Duration::from_secs(7))),
        "{e}"
    );

    fake.clear_request_log();
    let mut bad = spec();
    bad["location"] = json!("");
    bad["properties"].as_object_mut().unwrap().remove("zone");
    bad["tags"] = json!({});
    let e = create(&d, &class(bad), "m-6").await.unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument);
    for field in [
        "providerSpec.location",
        "providerSpec.properties.zone",
        "providerSpec.tags.kubernetes.io-cluster-",
    ] {
        assert!(e.message.contains(field), "{field} in {e}");
    }
    assert!(fake.request_log().is_empty(), "nothing was sent");

    let e = d
        .get_machine_status(GetMachineStatusRequest {
            machine: machine("m-5"),
            machine_class: c.clone(),
            secret: secret_with("wrong"),
            request_id: RequestId::generate(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::Unauthenticated, "{e}");
    assert!(
        !e.full_message().contains(SECRET),
        "the secret is never in a message"
    );
}

#[tokio::test]
async fn initialize_is_unimplemented_as_in_gardeners_provider() {
    let fake = fake().await;
    let e = driver(&fake)
        .initialize_machine(mcm_driver::InitializeMachineRequest {
            machine: machine("m-0"),
            machine_class: class(spec()),
            secret: secret(),
            request_id: RequestId::generate(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::Unimplemented);
    assert!(fake.request_log().is_empty());
}

#[tokio::test]
async fn volume_ids_of_azure_disks() {
    let fake = fake().await;
    let d = driver(&fake);
    let pvs: Vec<k8s_openapi::api::core::v1::PersistentVolumeSpec> = serde_json::from_value(json!([
        {"azureDisk": {"diskName": "d1", "diskURI": "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/disks/d1"}},
        {"csi": {"driver": "disk.csi.azure.com", "volumeHandle": "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/disks/d2"}},
        {"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"}}
    ]))
    .unwrap();
    let ids = d
        .get_volume_ids(GetVolumeIdsRequest {
            pv_specs: pvs,
            request_id: RequestId::generate(),
        })
        .await
        .unwrap()
        .volume_ids;
    assert_eq!(
        ids,
        vec![
            "d1",
            "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/disks/d2"
        ]
    );
}

/// A scripted ARM over HTTPS on 127.0.0.1 with a token endpoint of its own: a token for every
/// token request, `answer(base URL, path and query)` for every other request.
async fn scripted_arm(answer: fn(&str, &str) -> (u16, Value)) -> HttpsServer {
    let base = std::sync::Arc::new(std::sync::OnceLock::<String>::new());
    let own = base.clone();
    let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let base = own.get().cloned().unwrap_or_default();
        async move {
            let path = request
                .uri()
                .path_and_query()
                .map(|p| p.as_str().to_string())
                .unwrap_or_default();
            let (status, body) = if path.ends_with("/oauth2/v2.0/token") {
                let token = json!({"token_type": "Bearer", "expires_in": 3599,
                                   "ext_expires_in": 3599, "access_token": "scripted"});
                (200, token)
            } else {
                answer(&base, &path)
            };
            axum::response::Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(axum::body::Body::from(body.to_string()))
                .unwrap()
        }
    });
    let server = HttpsServer::start(app).await;
    base.set(server.url().to_string()).unwrap();
    server
}

async fn list_against(answer: fn(&str, &str) -> (u16, Value)) -> DriverError {
    let server = scripted_arm(answer).await;
    let d = AzureDriver::new(AzureDriverConfig {
        arm_endpoint: Some(server.url().to_string()),
        authority_host: Some(server.url().to_string()),
        extra_ca_pem: Some(server.ca_pem().to_string()),
        ..AzureDriverConfig::default()
    });
    tokio::time::timeout(
        Duration::from_secs(10),
        d.list_machines(ListMachinesRequest {
            machine_class: class(spec()),
            secret: secret(),
            request_id: RequestId::generate(),
        }),
    )
    .await
    .expect("the list ends")
    .unwrap_err()
}

#[tokio::test]
async fn a_list_whose_next_link_comes_again_ends_with_an_error() {
    let e = list_against(|base, _| {
        let next = format!("{base}/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines?api-version=2024-07-01&%24skiptoken=same");
        (200, json!({"value": [], "nextLink": next}))
    })
    .await;
    assert_eq!(e.code, Code::Internal, "{e}");
    assert!(e.message.contains("list virtualMachines"), "{e}");
    assert!(e.message.contains("came twice"), "{e}");
}

#[tokio::test]
async fn a_list_page_that_is_not_an_object_is_an_error() {
    let e = list_against(|_, _| (200, json!(["not", "a", "page"]))).await;
    assert_eq!(e.code, Code::Internal, "{e}");
    assert!(e.message.contains("not a JSON object"), "{e}");
}

#[tokio::test]
async fn a_refused_list_names_arms_code_and_message() {
    let e = list_against(|_, _| {
        let body = json!({"error": {"code": "AuthorizationFailed",
                                    "message": "no read on the resource group"}});
        (403, body)
    })
    .await;
    assert_eq!(e.code, Code::PermissionDenied, "{e}");
    assert!(
        e.message
            .contains("with HTTP 403 (AuthorizationFailed): no read on the resource group"),
        "{e}"
    );
}
